import sys, pytest
import attention.decode_configs as d
d.WARP_PIPE = sys.argv[1] == "1"
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[2:]]))
