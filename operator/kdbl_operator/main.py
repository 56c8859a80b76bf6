"""`kdbl-operator`: not built yet — the operator issue adds the kopf handlers.

Until then it says so and exits non-zero, so a Deployment never looks healthy while doing nothing.
"""

import sys


def main() -> None:
    print("kdbl-operator: not implemented yet in this release; manage tenants and sources with "
          "`kdbl-control tenant/source`", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()
