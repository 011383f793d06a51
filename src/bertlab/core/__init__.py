"""What every layer of bertlab stands on, knowing no model: `errors` (the one-line error types), `fsio` (files
written whole or not at all), `progress` (bars on a terminal, lines in a log), `host_memory`, `threads` (the CPU
thread choice), `jsonconfig` (what every family's config shares), `model_names` (a `--model` folder or a name
in the local Hugging Face cache) and `labels` (`IGNORE_INDEX`)."""
