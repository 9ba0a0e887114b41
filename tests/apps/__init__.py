"""User apps the tests run on real workers: modules outside the fenced packages, as a user writes them."""
