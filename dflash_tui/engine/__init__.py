"""The DFlash engine. It never imports Textual."""
