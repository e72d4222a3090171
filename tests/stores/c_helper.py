"""Whether this test run has the C listing helper, and the one reason tests about it skip.

``NEFFCACHE_NATIVE=0`` runs the suite on the pure-Python listing (the path a host without a
compiler takes): tests of the C walker itself then skip, saying so. A helper that is missing
without being turned off is a broken build, which test_the_c_helper_is_built fails for; the
tests that need it skip and point there instead of each failing on their own."""

from __future__ import annotations

import pytest

from neffcache.stores import local_listing

NATIVE = local_listing.native
STATUS = local_listing.native_listing()
WHY_NOT = ("" if NATIVE is not None
           else f"about the C walker, and {STATUS.why_off} turns it off" if STATUS.chosen
           else f"the C helper did not load ({STATUS.why_off}): test_the_c_helper_is_built fails for that")
needs_native = pytest.mark.skipif(NATIVE is None, reason=WHY_NOT)
