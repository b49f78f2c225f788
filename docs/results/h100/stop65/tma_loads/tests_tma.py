import sys, pytest
import attention.decode_configs as d
d.TMA_LOADS = True if sys.argv[1] == "on" else False
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[2:]]))
