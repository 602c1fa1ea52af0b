/*
 * slurmbox SPANK shim: the only C in slurmbox.
 *
 * It registers the --sandbox* options and, in slurmstepd (remote context),
 * hands every decision to Python:
 *   - slurm_spank_init_post_opt: decide whether the step is sandboxed (from
 *     the options and the partition slurmctld records), then start_supervisor:
 *     create this incarnation's runtime directory and the supervisor's
 *     listening socket (so tasks can connect before Python has started), then
 *     fork+exec the root-run supervisor (python -I -m
 *     slurmbox.step.supervisor) with a clean environment and the options as
 *     arguments. A failure is kept (refuse_step), not returned.
 *   - slurm_spank_task_init: a refused step's tasks print the reason and exit
 *     125; otherwise put the launcher in front of the task's argv
 *     (spank_prepend_task_argv on Slurm >= 23.11, argv[0] replacement before).
 *   - slurm_spank_exit: run the cleanup (python -I -m slurmbox.sandbox.cleanup)
 *     and wait for it, so nothing outlives the step.
 * In the submitting command (sbatch/salloc: allocator context, srun: local
 * context) slurm_spank_init_post_opt runs python -I -m
 * slurmbox.spank_plugin.submit_check for jobs that may run in a sandbox; its
 * exit status 1 refuses the submission (the reason is on stderr).
 *
 * API: /usr/include/slurm/spank.h, spank(7).
 * Admin arguments in plugstack.conf: python=PATH launcher=PATH runtime_dir=PATH
 * site_config=PATH required_partitions=P1,P2 (unknown keys are an error).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/slurm_version.h>
#include <slurm/spank.h>

SPANK_PLUGIN(slurmbox, 1);

#define SBX_OPT_COUNT 9
enum sbx_opt { O_SANDBOX, O_NO_SANDBOX, O_IMAGE, O_MOUNTS, O_WORKDIR, O_NETWORK, O_DRY_RUN, O_CHECKPOINT,
	       O_CHECKPOINT_INTERVAL };
static const char *opt_keys[SBX_OPT_COUNT] = {"sandbox", "no-sandbox", "image", "mounts", "workdir", "network", "dry-run",
					      "checkpoint", "checkpoint-interval"};
static char *opt_values[SBX_OPT_COUNT];
static int opt_given[SBX_OPT_COUNT];

static char conf_python[PATH_MAX] = "/opt/slurmbox/venv/bin/python3";
static char conf_launcher[PATH_MAX] = "/opt/slurmbox/libexec/slurmbox-launch";
static char conf_runtime_dir[256] = "/run/slurmbox";
static char conf_site_config[PATH_MAX] = "";
static char conf_required[1024] = "";

static int conf_ok;                   /* plugstack arguments parsed (submit side) */
static int sandboxed;                 /* this step runs in a sandbox */
static int multi_prog;                /* step launched with srun --multi-prog */
static char step_dir[1024];           /* runtime_dir/<node>/<job>.<step>.r<restarts>-<nonce> */
static char step_alias[1024];         /* runtime_dir/<node>/<job>.<step>: root's symlink to step_dir */
static char step_error[1024];         /* why this sandboxed step cannot start: task_init tells each task */
static char log_path[1200];           /* runtime_dir/<node>/log/<job>.<step>.log */
static char step_name[64];

static int opt_cb(int val, const char *optarg, int remote)
{
	(void)remote;
	if (val < 0 || val >= SBX_OPT_COUNT)
		return -1;
	free(opt_values[val]);
	opt_values[val] = strdup(optarg && strcmp(optarg, "(null)") ? optarg : "");
	opt_given[val] = 1;
	return 0;
}

static struct spank_option spank_opts[] = {
	{"sandbox", "[PROFILE]", "Run each task inside a gVisor sandbox (optional profile name).", 2, O_SANDBOX, opt_cb},
	{"no-sandbox", NULL, "Do not sandbox this step (refused where the partition requires it).", 0, O_NO_SANDBOX, opt_cb},
	{"sandbox-image", "PATH", "Root file system directory for the sandbox (default: host root, read-only).", 1, O_IMAGE, opt_cb},
	{"sandbox-mounts", "SRC:DST[:ro|rw][,...]", "Extra bind mounts into the sandbox.", 1, O_MOUNTS, opt_cb},
	{"sandbox-workdir", "PATH", "Working directory inside the sandbox.", 1, O_WORKDIR, opt_cb},
	{"sandbox-network", "none|sandbox|host", "Sandbox network mode (default none).", 1, O_NETWORK, opt_cb},
	{"sandbox-dry-run", NULL, "Print the generated OCI spec instead of running the step.", 0, O_DRY_RUN, opt_cb},
	{"sandbox-checkpoint", "transparent|signal[:SIG]|none",
	 "On preemption or a spot notice: checkpoint the sandbox (transparent), signal the program (default SIGUSR1), "
	 "or just requeue.", 1, O_CHECKPOINT, opt_cb},
	{"sandbox-checkpoint-interval", "MINUTES", "Periodic sandbox checkpoints (transparent mode).", 1,
	 O_CHECKPOINT_INTERVAL, opt_cb},
	SPANK_OPTIONS_TABLE_END
};

static int set_conf(char *dst, size_t size, const char *val, const char *key)
{
	if (strlen(val) >= size) {
		slurm_error("slurmbox: plugstack argument %s is too long", key);
		return -1;
	}
	strcpy(dst, val);
	return 0;
}

static int parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		char *eq = strchr(av[i], '=');
		if (!eq) {
			slurm_error("slurmbox: plugstack argument '%s' is not key=value", av[i]);
			return -1;
		}
		size_t klen = (size_t)(eq - av[i]);
		const char *val = eq + 1;
		int rc;
		if (klen == 6 && !strncmp(av[i], "python", klen))
			rc = set_conf(conf_python, sizeof(conf_python), val, "python");
		else if (klen == 8 && !strncmp(av[i], "launcher", klen))
			rc = set_conf(conf_launcher, sizeof(conf_launcher), val, "launcher");
		else if (klen == 11 && !strncmp(av[i], "runtime_dir", klen))
			rc = set_conf(conf_runtime_dir, sizeof(conf_runtime_dir), val, "runtime_dir");
		else if (klen == 11 && !strncmp(av[i], "site_config", klen))
			rc = set_conf(conf_site_config, sizeof(conf_site_config), val, "site_config");
		else if (klen == 19 && !strncmp(av[i], "required_partitions", klen))
			rc = set_conf(conf_required, sizeof(conf_required), val, "required_partitions");
		else {
			slurm_error("slurmbox: unknown plugstack argument '%.*s' (known: python, launcher, "
				    "runtime_dir, site_config, required_partitions)", (int)klen, av[i]);
			return -1;
		}
		if (rc)
			return rc;
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	for (struct spank_option *o = spank_opts; o->name; o++)
		if (spank_option_register(sp, o) != ESPANK_SUCCESS)
			return -1;
	if (spank_context() == S_CTX_REMOTE)
		return parse_args(ac, av);
	if (spank_context() == S_CTX_ALLOCATOR || spank_context() == S_CTX_LOCAL)
		conf_ok = parse_args(ac, av) == 0; /* a bad line is reported but blocks no submission */
	return 0;
}

/* True when name appears in the comma-separated list. */
static int in_list(const char *list, const char *name)
{
	size_t n = strlen(name);
	const char *p = list;
	while (n && *p) {
		const char *end = strchrnul(p, ',');
		if ((size_t)(end - p) == n && !strncmp(p, name, n))
			return 1;
		p = *end ? end + 1 : end;
	}
	return 0;
}

/*
 * Create (or accept) a root-owned directory that no one else can write to:
 * the runtime tree holds sockets and bundles root acts on.
 */
static int ensure_root_dir(const char *path, mode_t mode)
{
	struct stat st;
	if (mkdir(path, mode) != 0 && errno != EEXIST) {
		slurm_error("slurmbox: cannot create %s: %m", path);
		return -1;
	}
	if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022)) {
		slurm_error("slurmbox: %s must be a directory owned by root and writable only by root", path);
		return -1;
	}
	return 0;
}

static int env_truthy(const char *v)
{
	return v[0] && strcmp(v, "0") && strcasecmp(v, "no") && strcasecmp(v, "false");
}

static int getenv_job(spank_t sp, const char *name, char *buf, int len)
{
	buf[0] = '\0';
	return spank_getenv(sp, name, buf, len) == ESPANK_SUCCESS;
}

static void format_step(uint32_t stepid, char *buf, size_t len)
{
	/* Special step ids: slurm.h (SLURM_BATCH_SCRIPT, SLURM_INTERACTIVE_STEP). */
	if (stepid == SLURM_BATCH_SCRIPT)
		snprintf(buf, len, "batch");
	else if (stepid == SLURM_INTERACTIVE_STEP)
		snprintf(buf, len, "interactive");
	else
		snprintf(buf, len, "%u", stepid);
}

/*
 * A sandboxed step that cannot start: keep the reason for slurm_spank_task_init,
 * which writes it to each task's stderr and exits 125, so srun and the job fail
 * with the reason where the user reads it. (Failing slurm_spank_init_post_opt
 * itself shows only "Plugin initialization failed" and srun exits 0.)
 */
static int refuse_step(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(step_error, sizeof(step_error), fmt, ap);
	va_end(ap);
	slurm_error("slurmbox: %s", step_error);
	sandboxed = 1;
	return 0;
}

/* Undo what start_supervisor created before it failed: the socket, the alias, the directory. */
static void remove_partial_step(void)
{
	char path[1100];
	if (step_dir[0]) {
		snprintf(path, sizeof(path), "%s/supervisor.sock", step_dir);
		unlink(path);
		rmdir(step_dir);
	}
	if (step_alias[0]) {
		char target[1024];
		ssize_t n = readlink(step_alias, target, sizeof(target) - 1);
		const char *base = strrchr(step_dir, '/');
		if (n > 0 && base) {
			target[n] = '\0';
			if (!strcmp(target, base + 1))
				unlink(step_alias);
		}
	}
	step_dir[0] = '\0';
	step_alias[0] = '\0';
}

/*
 * Point runtime_dir/<node>/<job>.<step> at this incarnation's directory, so the
 * job's user and slurmbox's tools find the step by its Slurm id. Root-only
 * directory: the rename replaces an earlier incarnation's alias atomically.
 */
static int publish_alias(const char *node_dir, uint32_t jobid, const char *incarnation)
{
	char tmp[1100], target[256];
	snprintf(step_alias, sizeof(step_alias), "%s/%u.%s", node_dir, jobid, step_name);
	snprintf(target, sizeof(target), "%u.%s.%s", jobid, step_name, incarnation);
	snprintf(tmp, sizeof(tmp), "%s/.%s.alias", node_dir, target);
	unlink(tmp);
	if (symlink(target, tmp) != 0 || rename(tmp, step_alias) != 0) {
		unlink(tmp);
		step_alias[0] = '\0';
		return -1;
	}
	return 0;
}

static void add_arg(char **argv, int *argc, int max, char *arg)
{
	if (*argc < max - 1)
		argv[(*argc)++] = arg;
}

/*
 * srun --multi-prog: slurmstepd's step argv is {CONFIG_PATH, CONFIG_TEXT}
 * and each task's real argv is built from CONFIG_TEXT (srun(1) MULTIPLE
 * PROGRAM CONFIGURATION). Slurm 22.05 gives the step no other sign of it (no
 * variable, no SPANK item), so every argv that *could* be such a launch
 * counts as one: two words, and every line of the second that is not blank
 * or a comment starts with a task list (digits, ',', '-', '*'), blanks and
 * a program (srun refuses a line without one). Trailing newline or not, CRLF or not: a
 * false positive only refuses a step, a false negative runs it on the host.
 */
static int looks_like_multi_prog(int argc, char **argv)
{
	if (argc != 2)
		return 0;
	const char *line = argv[1];
	while (*line) {
		const char *end = strchrnul(line, '\n');
		const char *p = line;
		while (p < end && strchr(" \t\r\v\f", *p))
			p++;
		if (p < end && *p != '#') {
			const char *q = p;
			while (q < end && (strchr("0123456789,-*", *q)))
				q++;
			/* srun requires a program after the task list: "sleep 300" is not a configuration. */
			if (q == p || q == end || !strchr(" \t\r\v\f", *q))
				return 0;
			while (q < end && strchr(" \t\r\v\f", *q))
				q++;
			if (q == end)
				return 0;
		}
		line = *end ? end + 1 : end;
	}
	return 1;
}

/*
 * The job's partition as slurmctld records it, read as single fields
 * (`squeue -h -j ID -o "%A %P"`: the job id, a space, the partition; both are
 * set by Slurm or the admin, never by the user). Never search free text such
 * as `scontrol show job`: job name, comment and paths come first there and may
 * hold "Partition=..." (spaces and newlines included). The step's own
 * environment comes from the user's srun and may name any partition.
 * Returns 0 and fills buf, or -1.
 */
static int trusted_partition(uint32_t jobid, char *buf, size_t len)
{
	static char out[65536];
	int pipefd[2];
	if (pipe2(pipefd, O_CLOEXEC) != 0)
		return -1;
	char id[16], conf_env[PATH_MAX + 16];
	snprintf(id, sizeof(id), "%u", jobid);
	const char *conf = getenv("SLURM_CONF"); /* slurmstepd's own environment */
	snprintf(conf_env, sizeof(conf_env), "SLURM_CONF=%s", conf && conf[0] ? conf : "/etc/slurm/slurm.conf");
	pid_t pid = fork();
	if (pid < 0) {
		close(pipefd[0]);
		close(pipefd[1]);
		return -1;
	}
	if (pid == 0) {
		dup2(pipefd[1], 1);
		int devnull = open("/dev/null", O_RDWR);
		if (devnull >= 0) {
			dup2(devnull, 0);
			dup2(devnull, 2);
		}
		char *argv[] = {"squeue", "-h", "-j", id, "-o", "%A %P", NULL};
		char *envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", conf_env, NULL};
		execve("/usr/bin/squeue", argv, envp);
		execve("/usr/local/bin/squeue", argv, envp);
		_exit(127);
	}
	close(pipefd[1]);
	size_t used = 0;
	char drain[4096];
	for (;;) {
		/* Past the buffer, keep reading (and dropping) so scontrol never blocks on a full pipe. */
		int full = used == sizeof(out) - 1;
		ssize_t n = full ? read(pipefd[0], drain, sizeof(drain))
				 : read(pipefd[0], out + used, sizeof(out) - 1 - used);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (!full)
			used += (size_t)n;
	}
	out[used] = '\0';
	close(pipefd[0]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return -1;
	/*
	 * Lines "ID PARTITION\n", both fields Slurm's or the admin's (numeric id, partition
	 * name). A heterogeneous job lists each of its components: exactly one line must
	 * carry this step's job id; anything else is refused, not guessed at.
	 */
	size_t idlen = strlen(id);
	const char *found = NULL;
	size_t found_len = 0;
	for (const char *line = out; *line;) {
		const char *end = strchr(line, '\n');
		if (!end)
			return -1; /* every line ends with a newline */
		if ((size_t)(end - line) > idlen && !strncmp(line, id, idlen) && line[idlen] == ' ') {
			const char *p = line + idlen + 1;
			size_t n = (size_t)(end - p);
			if (found || n == 0 || n >= len || memchr(p, ' ', n))
				return -1;
			found = p;
			found_len = n;
		}
		line = end + 1;
	}
	if (!found)
		return -1;
	memcpy(buf, found, found_len);
	buf[found_len] = '\0';
	return 0;
}

/*
 * Submit side (sbatch, salloc, srun before the job is queued): run the
 * Python check as the submitting user with a fixed environment; it reads the
 * command's argv, input environment and batch script through /proc/PID of
 * this process. Exit status 1 refuses the submission; anything else that is
 * not 0 is a warning, never a refusal. Jobs that cannot run in a sandbox, or
 * chose a checkpoint mode other than transparent, and steps of a running job
 * (srun with SLURM_JOB_ID) skip it.
 */
static int submit_check(spank_context_t ctx)
{
	if (!conf_ok || (ctx == S_CTX_LOCAL && getenv("SLURM_JOB_ID")))
		return 0;
	const char *env = getenv("SLURMBOX_SANDBOX");
	int wants = conf_required[0] || (env && env_truthy(env));
	for (int i = 0; i < SBX_OPT_COUNT; i++)
		wants |= opt_given[i] && i != O_NO_SANDBOX;
	if (!wants || (opt_given[O_CHECKPOINT] && opt_values[O_CHECKPOINT][0] &&
		       strcmp(opt_values[O_CHECKPOINT], "transparent") != 0))
		return 0;

	char s_pid[32];
	static char optbuf[SBX_OPT_COUNT][PATH_MAX + 32];
	char *argv[64];
	int argc = 0;
	snprintf(s_pid, sizeof(s_pid), "%d", (int)getpid());
	add_arg(argv, &argc, 64, conf_python);
	add_arg(argv, &argc, 64, "-I");
	add_arg(argv, &argc, 64, "-m");
	add_arg(argv, &argc, 64, "slurmbox.spank_plugin.submit_check");
	add_arg(argv, &argc, 64, "--pid"); add_arg(argv, &argc, 64, s_pid);
	add_arg(argv, &argc, 64, "--site-config"); add_arg(argv, &argc, 64, conf_site_config);
	add_arg(argv, &argc, 64, "--required-partitions"); add_arg(argv, &argc, 64, conf_required);
	for (int i = 0; i < SBX_OPT_COUNT; i++) {
		if (!opt_given[i])
			continue;
		if ((size_t)snprintf(optbuf[i], sizeof(optbuf[i]), "%s=%s", opt_keys[i], opt_values[i]) >=
		    sizeof(optbuf[i]))
			return 0; /* the step start reports the over-long value */
		add_arg(argv, &argc, 64, "--option");
		add_arg(argv, &argc, 64, optbuf[i]);
	}
	argv[argc] = NULL;
	char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", NULL};

	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		return 0;
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, 0);
		dup2(2, 1); /* stdout carries sbatch --parsable output: keep ours off it */
		if (close_range(3, ~0U, 0) != 0) {
			long max_fd = sysconf(_SC_OPEN_MAX);
			for (long fd = 3; fd < (max_fd > 0 && max_fd < 65536 ? max_fd : 65536); fd++)
				close((int)fd);
		}
		execve(conf_python, argv, envp);
		_exit(127);
	}
	int status = 0;
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR)
			return 0;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 1)
		return -1;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fprintf(stderr, "slurmbox: warning: the submit-time check (%s -m slurmbox.spank_plugin.submit_check) "
			"did not run (status %d); the job's steps are checked when they start\n", conf_python, status);
	return 0;
}

/*
 * slurmstepd side of a sandboxed step: create this incarnation's runtime
 * directory (exclusively: a requeued or migrated-back step reuses job and step
 * ids, so the name carries the restart count and a random nonce) and the
 * supervisor's listening socket (so tasks can connect before Python has
 * started), then fork+exec the root-run supervisor with a clean environment
 * and the options as arguments. Every failure goes through refuse_step and
 * leaves nothing behind.
 */
static int start_supervisor(spank_t sp, uint32_t jobid, uint32_t stepid, const char *partition, int required,
			    int job_argc, char **job_argv)
{
	uint32_t ntasks = 0, restarts = 0;
	uid_t uid = 0;
	gid_t gid = 0;
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks) != ESPANK_SUCCESS)
		return refuse_step("cannot read the step's user, group or task count from slurmstepd");
	if (spank_get_item(sp, S_SLURM_RESTART_COUNT, &restarts) != ESPANK_SUCCESS)
		restarts = 0;

	static char optbuf[SBX_OPT_COUNT][PATH_MAX + 32];
	for (int i = 0; i < SBX_OPT_COUNT; i++) {
		if (opt_given[i] && (size_t)snprintf(optbuf[i], sizeof(optbuf[i]), "%s=%s", opt_keys[i],
						     opt_values[i]) >= sizeof(optbuf[i]))
			return refuse_step("the value of --sandbox-%s is %zu bytes long; the limit is %d",
					   opt_keys[i], strlen(opt_values[i]), PATH_MAX);
	}

	char node[65];
	if (gethostname(node, sizeof(node)) != 0)
		return refuse_step("gethostname: %m");
	node[sizeof(node) - 1] = '\0';
	format_step(stepid, step_name, sizeof(step_name));

	unsigned char nonce[6];
	if (getrandom(nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce))
		return refuse_step("getrandom: %m");
	char incarnation[64];
	snprintf(incarnation, sizeof(incarnation), "r%u-%02x%02x%02x%02x%02x%02x", restarts, nonce[0], nonce[1],
		 nonce[2], nonce[3], nonce[4], nonce[5]);

	char node_dir[512], log_dir[600];
	snprintf(node_dir, sizeof(node_dir), "%s/%s", conf_runtime_dir, node);
	snprintf(log_dir, sizeof(log_dir), "%s/log", node_dir);
	snprintf(log_path, sizeof(log_path), "%s/%u.%s.log", log_dir, jobid, step_name);
	if (ensure_root_dir(conf_runtime_dir, 0711) || ensure_root_dir(node_dir, 0711) ||
	    ensure_root_dir(log_dir, 0700))
		return refuse_step("slurmbox's runtime directory %s is not usable on %s (see slurmd's log)",
				   conf_runtime_dir, node);
	char dir[1024];
	snprintf(dir, sizeof(dir), "%s/%u.%s.%s", node_dir, jobid, step_name, incarnation);
	if (mkdir(dir, 0700) != 0)  /* never EEXIST-tolerant: no one may have made it first */
		return refuse_step("cannot create the step's runtime directory %s: %m", dir);
	snprintf(step_dir, sizeof(step_dir), "%s", dir);
	/* The job user may traverse the step directory to reach the socket. */
	if (chown(step_dir, 0, gid) != 0 || chmod(step_dir, 0710) != 0) {
		refuse_step("cannot set the owner of %s: %m", step_dir);
		remove_partial_step();
		return 0;
	}

	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	if ((size_t)snprintf(addr.sun_path, sizeof(addr.sun_path), "%s/supervisor.sock", step_dir) >= sizeof(addr.sun_path)) {
		refuse_step("runtime_dir %s is too long for a socket path (ask the admin to shorten it)",
			    conf_runtime_dir);
		remove_partial_step();
		return 0;
	}
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
	    chown(addr.sun_path, uid, gid) != 0 || chmod(addr.sun_path, 0600) != 0 ||
	    listen(lfd, 128) != 0) {
		refuse_step("cannot create the supervisor socket %s: %m", addr.sun_path);
		if (lfd >= 0)
			close(lfd);
		remove_partial_step();
		return 0;
	}
	if (publish_alias(node_dir, jobid, incarnation) != 0) {
		refuse_step("cannot link %s/%u.%s to the step's runtime directory: %m", node_dir, jobid, step_name);
		close(lfd);
		remove_partial_step();
		return 0;
	}

	char s_job[32], s_step[64], s_uid[32], s_gid[32], s_tasks[32], s_fd[16];
	snprintf(s_job, sizeof(s_job), "%u", jobid);
	snprintf(s_step, sizeof(s_step), "%s", step_name);
	snprintf(s_uid, sizeof(s_uid), "%u", (unsigned)uid);
	snprintf(s_gid, sizeof(s_gid), "%u", (unsigned)gid);
	snprintf(s_tasks, sizeof(s_tasks), "%u", ntasks);
	snprintf(s_fd, sizeof(s_fd), "%d", 3);

	char *argv[64];
	int argc = 0;
	add_arg(argv, &argc, 64, conf_python);
	add_arg(argv, &argc, 64, "-I");
	add_arg(argv, &argc, 64, "-m");
	add_arg(argv, &argc, 64, "slurmbox.step.supervisor");
	add_arg(argv, &argc, 64, "--listen-fd"); add_arg(argv, &argc, 64, s_fd);
	add_arg(argv, &argc, 64, "--step-dir"); add_arg(argv, &argc, 64, step_dir);
	add_arg(argv, &argc, 64, "--runtime-dir"); add_arg(argv, &argc, 64, conf_runtime_dir);
	add_arg(argv, &argc, 64, "--node"); add_arg(argv, &argc, 64, node);
	add_arg(argv, &argc, 64, "--job"); add_arg(argv, &argc, 64, s_job);
	add_arg(argv, &argc, 64, "--step"); add_arg(argv, &argc, 64, s_step);
	add_arg(argv, &argc, 64, "--uid"); add_arg(argv, &argc, 64, s_uid);
	add_arg(argv, &argc, 64, "--gid"); add_arg(argv, &argc, 64, s_gid);
	add_arg(argv, &argc, 64, "--local-tasks"); add_arg(argv, &argc, 64, s_tasks);
	add_arg(argv, &argc, 64, "--partition"); add_arg(argv, &argc, 64, (char *)partition);
	add_arg(argv, &argc, 64, "--launcher"); add_arg(argv, &argc, 64, conf_launcher);
	if (conf_site_config[0]) {
		add_arg(argv, &argc, 64, "--site-config");
		add_arg(argv, &argc, 64, conf_site_config);
	}
	const char *slurm_conf = getenv("SLURM_CONF"); /* slurmstepd's own environment */
	if (slurm_conf && slurm_conf[0]) {
		add_arg(argv, &argc, 64, "--slurm-conf");
		add_arg(argv, &argc, 64, (char *)slurm_conf);
	}
	if (required)
		add_arg(argv, &argc, 64, "--partition-requires-sandbox");
	if (stepid == SLURM_BATCH_SCRIPT && job_argc > 0 && job_argv && job_argv[0]) {
		add_arg(argv, &argc, 64, "--batch-script");
		add_arg(argv, &argc, 64, job_argv[0]);
	}
	for (int i = 0; i < SBX_OPT_COUNT; i++) {
		if (!opt_given[i])
			continue;
		add_arg(argv, &argc, 64, "--option");
		add_arg(argv, &argc, 64, optbuf[i]);
	}
	argv[argc] = NULL;

	/* Root-run Python gets a fixed environment, never the job's. */
	char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", NULL};

	pid_t pid = fork();
	if (pid < 0) {
		refuse_step("fork: %m");
		close(lfd);
		remove_partial_step();
		return 0;
	}
	if (pid == 0) {
		/* Double fork so the supervisor is not slurmstepd's child; the
		 * intermediate child records its pid before the step goes on, so
		 * cleanup can always find it. */
		pid_t supervisor = fork();
		if (supervisor != 0) {
			/* No slurm_error() here: a fork of multi-threaded slurmstepd. */
			char pidpath[1100], pidtext[32];
			snprintf(pidpath, sizeof(pidpath), "%s/supervisor.pid", step_dir);
			int pfd = open(pidpath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
			int ok = pfd >= 0;
			if (ok) {
				int n = snprintf(pidtext, sizeof(pidtext), "%d\n", (int)supervisor);
				ok = write(pfd, pidtext, (size_t)n) == n;
				close(pfd);
			}
			_exit(supervisor > 0 && ok ? 0 : 1);
		}
		setsid();
		/* slurmstepd blocks many signals; the supervisor and runsc need them. */
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		for (int sig = 1; sig < NSIG; sig++)
			signal(sig, SIG_DFL);
		if (lfd == 3) {
			if (fcntl(3, F_SETFD, 0) != 0)
				_exit(127);
		} else if (dup2(lfd, 3) < 0) {
			_exit(127);
		}
		int devnull = open("/dev/null", O_RDWR);
		if (devnull >= 0) {
			dup2(devnull, 0);
			dup2(devnull, 1);
		}
		int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		if (logfd >= 0)
			dup2(logfd, 2);
		long max_fd = sysconf(_SC_OPEN_MAX);
		for (long fd = 4; fd < (max_fd > 0 ? max_fd : 65536); fd++)
			close((int)fd);
		execve(conf_python, argv, envp);
		_exit(127);
	}
	close(lfd);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return refuse_step("the sandbox supervisor did not start (see %s on %s)", log_path, node);
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	spank_context_t ctx = spank_context();
	if (ctx == S_CTX_ALLOCATOR || ctx == S_CTX_LOCAL)
		return submit_check(ctx);
	if (ctx != S_CTX_REMOTE)
		return 0;

	uint32_t jobid = 0, stepid = 0;
	if (spank_get_item(sp, S_JOB_ID, &jobid) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, &stepid) != ESPANK_SUCCESS)
		return 0;
	if (stepid == SLURM_EXTERN_CONT)
		return 0;

	char envbuf[256], partition[256] = "";
	int env_wants = getenv_job(sp, "SLURMBOX_SANDBOX", envbuf, sizeof(envbuf)) && env_truthy(envbuf);
	/* Any --sandbox-* option asks for a sandbox as --sandbox does. */
	int option_wants = opt_given[O_SANDBOX] || opt_given[O_IMAGE] || opt_given[O_MOUNTS] ||
			   opt_given[O_WORKDIR] || opt_given[O_NETWORK] || opt_given[O_DRY_RUN] ||
			   opt_given[O_CHECKPOINT] || opt_given[O_CHECKPOINT_INTERVAL];
	if ((option_wants || env_wants || conf_required[0]) &&
	    trusted_partition(jobid, partition, sizeof(partition)) != 0)
		/* Fail closed: the step may belong to a partition that requires a sandbox. */
		return refuse_step("cannot read the partition of job %u from slurmctld, so the step's sandbox "
				   "policy is unknown; try again, or ask the admin to check slurmctld", jobid);
	int required = in_list(conf_required, partition);
	if (opt_given[O_NO_SANDBOX])
		sandboxed = required; /* the supervisor refuses it with a message */
	else
		sandboxed = option_wants || env_wants || required;
	if (!sandboxed)
		return 0;

	int job_argc = 0;
	char **job_argv = NULL;
	if (spank_get_item(sp, S_JOB_ARGV, &job_argc, &job_argv) == ESPANK_SUCCESS)
		multi_prog = looks_like_multi_prog(job_argc, job_argv);
#if SLURM_VERSION_NUMBER < SLURM_VERSION_NUM(23, 11, 0)
	if (multi_prog) /* the per-task argv of --multi-prog is out of SPANK's reach before 23.11 */
		return refuse_step("--sandbox cannot be combined with --multi-prog on Slurm %d.%02d (needs Slurm "
				   "23.11 or later); run one srun per program instead",
				   SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER), SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER));
#endif
	return start_supervisor(sp, jobid, stepid, partition, required, job_argc, job_argv);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (!sandboxed || spank_context() != S_CTX_REMOTE)
		return 0;
	if (step_error[0]) {
		/* The task's own stderr: srun's terminal or the batch job's error file. */
		fprintf(stderr, "slurmbox: error: %s\nslurmbox: the step did not start\n", step_error);
		fflush(stderr);
		_exit(125); /* EXIT_SANDBOX_FAILED, as the launcher and supervisor report it */
	}

	char sock[1100];
	snprintf(sock, sizeof(sock), "%s/supervisor.sock", step_dir);
	spank_setenv(sp, "SLURMBOX_SUPERVISOR_SOCKET", sock, 1);
#if SLURM_VERSION_NUMBER >= SLURM_VERSION_NUM(23, 11, 0)
	const char *prefix[] = {conf_launcher};
	spank_unsetenv(sp, "SLURMBOX_TASK_ARGV0");
	if (spank_prepend_task_argv(sp, 1, prefix) != ESPANK_SUCCESS) {
		slurm_error("slurmbox: spank_prepend_task_argv failed");
		return -1;
	}
#else
	int argc = 0;
	char **argv = NULL;
	if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1) {
		slurm_error("slurmbox: cannot read the task's argv");
		return -1;
	}
	/* Shared by all tasks of the step: argv[0] is replaced once. */
	if (strcmp(argv[0], conf_launcher) != 0) {
		spank_setenv(sp, "SLURMBOX_TASK_ARGV0", argv[0], 1);
		argv[0] = strdup(conf_launcher);
	}
#endif
	return 0;
}

/*
 * Wait up to two seconds for the supervisor (not our child: it was double
 * forked) to finish its own teardown. True when it has exited and removed the
 * step directory, so the Python cleanup need not start.
 */
static int supervisor_finished(void)
{
	char pidpath[1100], text[32] = "";
	snprintf(pidpath, sizeof(pidpath), "%s/supervisor.pid", step_dir);
	int fd = open(pidpath, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, text, sizeof(text) - 1);
		close(fd);
		text[n > 0 ? n : 0] = '\0';
	}
	pid_t pid = (pid_t)atoi(text);
	for (int waited_ms = 0; pid > 0 && waited_ms < 2000; waited_ms += 2) {
		if (kill(pid, 0) != 0 && errno == ESRCH)
			break;
		usleep(2000);
	}
	struct stat st;
	return stat(step_dir, &st) != 0 && errno == ENOENT;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)sp; (void)ac; (void)av;
	if (!sandboxed || !step_dir[0] || spank_context() != S_CTX_REMOTE)
		return 0;
	if (supervisor_finished())
		return 0; /* it tore the sandbox down itself: nothing to clean */
	char *argv[] = {conf_python, "-I", "-m", "slurmbox.sandbox.cleanup", "--step-dir", step_dir,
			"--runtime-dir", conf_runtime_dir, NULL};
	char *envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", NULL};
	pid_t pid = fork();
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDWR);
		if (devnull >= 0) {
			dup2(devnull, 0);
			dup2(devnull, 1);
			dup2(devnull, 2);
		}
		execve(conf_python, argv, envp);
		_exit(127);
	}
	if (pid > 0)
		waitpid(pid, NULL, 0);
	return 0;
}
