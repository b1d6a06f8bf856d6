"""python3 -m gmsfs: gmsfsctl, from wherever the package is installed (a venv, an image)."""
import sys

from gmsfs.ctl import main

sys.exit(main())
