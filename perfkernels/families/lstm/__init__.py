"""The lstm kernel family (see perfkernels/families/__init__.py for what a family folder holds)."""
