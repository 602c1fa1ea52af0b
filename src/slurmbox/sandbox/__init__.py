"""Primitives of a sandboxed step: the OCI bundle for gVisor (runsc), devices, options,
the runsc handle, step cgroups, user paths and their staging binds, the wire format of
the step processes, step directories, cleanup and the sandbox records."""
