"""Thin typer commands: parse, make one library call, render."""
