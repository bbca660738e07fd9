import gc
import sys

from flextrain.cli import main

code = main()
# The interpreter's last collections would walk every object torch's import made (~1 s a process at
# exit, on every worker, parameter server and job); nothing among them waits to be finalized.
gc.freeze()
sys.exit(code)
