"""Code generation: turning a planned IR graph into native code (CPU first)."""
