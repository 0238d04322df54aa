"""PyInstaller's entry script: the frozen executable runs dflash_desktop.__main__.main, which opens the
window, runs a command-line command, or (as `<app> --worker`) becomes the engine process."""
import sys

from dflash_desktop.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
