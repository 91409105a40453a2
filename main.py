"""dml2comm command line: ``python main.py MODEL.onnx --d 2 --p 4 --t 2``."""
from dml2comm.cli import main
raise SystemExit(main())
