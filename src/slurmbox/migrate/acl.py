"""Owner-only access for checkpoint files: root plus one user, through a POSIX ACL.

A checkpoint is written by root and must be readable by root and the job's
user only (never writable by the user: root restores from it). Python has no
ACL API, so the ACL is written as the kernel's extended attribute
``system.posix_acl_access`` directly. Format (Linux
``include/uapi/linux/posix_acl_xattr.h`` and ``include/linux/posix_acl.h``):
a little-endian u32 version (2) followed by entries of (u16 tag, u16 perm,
u32 id), sorted by tag then id; tags USER_OBJ=1, USER=2, GROUP_OBJ=4,
GROUP=8, MASK=0x10, OTHER=0x20; perm bits r=4, w=2, x=1.
"""

import errno
import os
import struct

POSIX_ACL_XATTR = "system.posix_acl_access"
_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_UNDEFINED_ID = 0xFFFFFFFF


class AclUnsupported(OSError):
    """The file system holding the store does not support POSIX ACLs."""


def encode_acl(owner_perm, user_id, user_perm):
    """Bytes of an ACL: owner ``owner_perm``, user ``user_id`` ``user_perm``, group and others nothing.

    Perms are 3-bit ints (r=4, w=2, x=1). Returns bytes for POSIX_ACL_XATTR.
    """
    entries = [(_USER_OBJ, owner_perm, _UNDEFINED_ID), (_USER, user_perm, user_id),
               (_GROUP_OBJ, 0, _UNDEFINED_ID), (_MASK, user_perm, _UNDEFINED_ID), (_OTHER, 0, _UNDEFINED_ID)]
    return struct.pack("<I", _VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def decode_acl(data):
    """Entries of an ACL xattr value: list of (tag, perm, id). Raises ValueError if malformed."""
    if len(data) < 4 or (len(data) - 4) % 8 or struct.unpack_from("<I", data)[0] != _VERSION:
        raise ValueError("not a version-2 POSIX ACL")
    return [struct.unpack_from("<HHI", data, offset) for offset in range(4, len(data), 8)]


def restrict_to(path, uid):
    """Make ``path`` (root-owned) accessible to root and user ``uid`` only; the user may read, never write.

    Directories get r-x for the user, files r--. ``uid`` 0 leaves root only.
    Raises AclUnsupported when the file system refuses ACLs (mount option
    ``noacl`` or a file system without them); the path is then root-only (0700/0600).
    """
    is_dir = os.path.isdir(path)
    os.chown(path, 0, 0)
    os.chmod(path, 0o700 if is_dir else 0o600)
    if uid == 0:
        return
    user_perm = 5 if is_dir else 4
    try:
        os.setxattr(path, POSIX_ACL_XATTR, encode_acl(7 if is_dir else 6, uid, user_perm))
    except OSError as err:
        if err.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            raise AclUnsupported(err.errno, "the checkpoint store's file system does not support POSIX ACLs "
                                 "(mount it with 'acl'); checkpoints there are readable by root only", path)
        raise
