#!/usr/bin/env python3
"""Entry point for proteomics-gpu jobs: predict fragment intensities with peptdeep."""
import sys

from peptdeep.pretrained_models import ModelManager


def main() -> int:
    manager = ModelManager(device="cuda")
    manager.load_installed_models()
    print("peptdeep models loaded on", manager.device, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
