import sys

from kdbl_core.db.pgext import main

sys.exit(main())
