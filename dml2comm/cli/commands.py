"""The subcommands: each one's front-end module and entry point, in the order ``--help`` lists
them; any other first word of the command line is the analysis of a model."""

from __future__ import annotations

__all__ = ["COMMANDS"]

COMMANDS: dict[str, tuple[str, str]] = {
    "zoo": ("dml2comm.cli.zoo", "run_zoo"),
    "presets": ("dml2comm.cli.presets", "run_presets"),
    "collective": ("dml2comm.cli.collective", "run_collective"),
    "sweep": ("dml2comm.cli.search", "run_sweep_command"),
    "compare": ("dml2comm.cli.search", "run_compare_command"),
    "trace": ("dml2comm.cli.trace", "run_trace_command"),
    "validate": ("dml2comm.cli.validate", "run_validate_command"),
    "calibrate": ("dml2comm.cli.calibrate", "run_calibrate_command"),
}
