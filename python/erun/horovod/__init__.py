"""erun.horovod: Horovod's API over erun, for programs written for Horovod.

Change one line, ``import horovod.torch as hvd`` to ``import
erun.horovod.torch as hvd``, and run the program under ``erun`` with the
command line it had under ``horovodrun``. Elastic programs
(``hvd.elastic.run``, ``hvd.elastic.TorchState``) recover in place: the
survivors keep their process and go back to the last commit in memory. See
docs/horovod.md for what is supported, what differs and what is not.
"""
