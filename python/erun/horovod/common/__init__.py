"""Horovod's framework-independent names (``horovod.common``) over erun."""
