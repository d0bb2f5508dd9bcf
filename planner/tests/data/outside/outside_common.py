"""What the converters of outside runs share (convert_sailor.py,
convert_amp.py): the checkout and commit they read, and polychip's model
files."""
import subprocess
import sys


def checkout_and_commit():
    """The repository checkout (argv[1]) and the full hash of the commit
    to read (argv[2], by default HEAD)."""
    root = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else "HEAD"
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    return root, commit


def toml_model(path):
    """A polychip model file as a dict."""
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)
