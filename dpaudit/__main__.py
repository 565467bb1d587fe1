from dpaudit.cli import main
import sys
sys.exit(main())
