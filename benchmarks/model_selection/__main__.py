"""``python -m benchmarks.model_selection``."""

from .bench import main

if __name__ == "__main__":
    main()
