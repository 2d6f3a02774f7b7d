#!/usr/bin/env python
"""The example's manage.py: ``python example_django/manage.py runserver``
from the repository root (or from anywhere)."""

import os
import sys
from pathlib import Path


def main() -> None:
    # The repository root, so that example_django, django_streamer and
    # example_models import without an install (python puts only this file's
    # folder on sys.path).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_django.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
