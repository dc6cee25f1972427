"""Remote engines: an OpenAI-compatible server (`dflash-tui serve`, vLLM, SGLang, mlx_lm.server, Ollama…)
seen as the engine's events. Nothing here imports Textual or MLX."""
