import sys

from flextrain.cli import main

sys.exit(main())
