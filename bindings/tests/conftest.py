"""pytest set-up: import the staged package from the build tree and expose the repository paths."""

import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("IFEC_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(BUILD / "python"))


@pytest.fixture(scope="session")
def repo():
    return REPO


@pytest.fixture(scope="session")
def build_dir():
    if not (BUILD / "bin" / "ifec-cli").exists():
        pytest.fail(f"no build at {BUILD}: run ./ifec build first (or set IFEC_BUILD_DIR)")
    return BUILD
