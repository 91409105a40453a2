"""dml2comm command line: ``python main.py MODEL.onnx --d 2 --p 4 --t 2``."""
from dml2comm.bootstrap import use_project_environment  # standard library only

if __name__ == "__main__":  # worker processes that are spawned (Dask's LocalCluster) import this file again
    use_project_environment(__file__)  # `python` without the packages: re-run under ./.venv, or say how to make it
    from dml2comm.cli import main
    raise SystemExit(main())
