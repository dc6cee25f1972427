"""dflash-tui: chat with a local LLM on MLX and watch DFlash speculative decoding work."""

__version__ = "0.1.0"
