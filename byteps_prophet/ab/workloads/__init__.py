"""The training jobs the A/B and the compose cluster run: one benchmark per framework (``benches``),
and the containers' training entrypoint (``train_entrypoint``). Each is started as
``python -m <module>.__name__``; importing one is cheap (torch and mxnet load when a benchmark runs).

This package imports none of its modules itself: ``python -m`` of a module its package already
imported runs it twice.
"""
