"""One module per `fd` command.

Convention (main.py mounts them):
- single commands (serve, chat, complete, run_batch, collect_env) expose a function named after the
  module (`serve.serve`, `run_batch.run_batch`, ...), registered with `app.command(name)`;
- command groups (tokenizer, bench) expose a `typer.Typer` named `app`, mounted with `app.add_typer`.
A command module imports only typer/fdcli/leaf engine modules at top level; paddle, httpx, transformers,
rich.progress and engine internals are imported inside the command function so `fd --help` stays fast.
"""
