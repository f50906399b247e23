"""The `medfast` command of a pip install: runs the native program the package carries
(medfast/bin/medfast, which hands the commands that need tensors to medfast-torch beside it)."""
import os
import sys


def main():
    program = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "medfast")
    if not os.access(program, os.X_OK):
        sys.exit(f"medfast: the package's program {program} is missing; install medfast again "
                 "(pip install --no-build-isolation . in its checkout)")
    os.execv(program, [program, *sys.argv[1:]])


if __name__ == "__main__":
    main()
