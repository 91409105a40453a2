"""The old home of the shared argparse pieces, now :mod:`dml2comm.cli.args`: kept only for
``dml2comm/calibrate/command.py`` until its front end moves into :mod:`dml2comm.cli`; delete then."""

from dml2comm.cli.args import OneLineParser, positive_int

__all__ = ["OneLineParser", "positive_int"]
