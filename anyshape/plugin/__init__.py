"""Plugin mode: compile the supported parts of a PyTorch graph, run the rest in PyTorch.

``partition`` finds clusters of supported ops, ``compiled_cluster`` turns one
cluster into a callable compiled unit, ``assemble`` rewrites the FX graph to
call them, ``dynamo_backend`` plugs this into ``torch.compile`` and ``explain``
reports what happened.
"""
