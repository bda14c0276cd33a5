"""``python -m benchmarks.scaling``."""

from .bench import main

if __name__ == "__main__":
    main()
