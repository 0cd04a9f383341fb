"""The PyTorch frontend: capture (torch.export, TorchDynamo), ATen-to-IR lowering.

Imports torch; the core (ir/, passes/, runtime/) never does.
"""
