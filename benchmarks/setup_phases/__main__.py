"""``python -m benchmarks.setup_phases``."""

from .bench import main

if __name__ == "__main__":
    main()
