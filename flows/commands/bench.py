"""Subcommands (to be filled in by its owner)."""

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this module's subcommands."""
