"""The SPANK shim (``slurmbox_spank.c``) and the steps that build and install it."""
