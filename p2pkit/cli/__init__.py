"""typer apps, one module per command group."""
