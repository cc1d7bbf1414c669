import subprocess
import sys


def test_sdk_imports_without_django():
    code = "import sys, trainyard; assert 'django' not in sys.modules, sorted(m for m in sys.modules if m.startswith('django'))"
    subprocess.run([sys.executable, "-c", code], check=True)
