"""Training recipes: the DFlash draft trainer and the bundled demo pair's build."""
