"""dml2comm command line: ``python main.py MODEL.onnx --d 2 --p 4 --t 2``."""
from dml2comm.cli import main
if __name__ == "__main__":  # worker processes that are spawned (Dask's LocalCluster) import this file again
    raise SystemExit(main())
