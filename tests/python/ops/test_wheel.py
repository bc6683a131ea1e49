"""The package as pip builds it from a fresh clone: tools/setup.sh runs
`pip wheel --no-build-isolation .` on its own build folder (build/wheel/);
here that wheel is installed offline into a temporary folder and imported
from there alone (not from build/python), and one op runs. Exits 77
(skipped) in a build folder that setup.sh did not make (no build/wheel/)."""
import glob
import os
import subprocess
import sys
import tempfile

import perftrain

BUILD = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(perftrain.__file__))))
CHECK = """
import sys, torch, perftrain
assert perftrain.__file__.startswith(sys.argv[1]), perftrain.__file__
x, gate, y = torch.randn(2, 3, 8), torch.randn(2, 8), torch.randn(2, 3, 8)
torch.testing.assert_close(perftrain.ops.gated_residual(x, gate, y), x + gate[:, None] * y)
print("imported", perftrain.__file__)
"""


def main():
    wheels = glob.glob(os.path.join(BUILD, "wheel", "perftrain-*.whl"))
    if not os.path.isdir(os.path.join(BUILD, "wheel")):
        print(f"no {BUILD}/wheel (tools/setup.sh makes it): skipped")
        return 77
    if len(wheels) != 1:
        print(f"expected one wheel in {BUILD}/wheel, found {wheels}")
        return 1
    with tempfile.TemporaryDirectory() as target:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-index", "--target", target, wheels[0]], check=True)
        env = dict(os.environ, PYTHONPATH=target)
        done = subprocess.run([sys.executable, "-c", CHECK, target], env=env, cwd=target)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
