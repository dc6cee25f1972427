"""`dflash-tui serve`: an OpenAI-compatible HTTP server on one DFlash engine.

The engine never imports Textual, and neither does anything here.
"""
