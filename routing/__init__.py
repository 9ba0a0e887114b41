"""The worker registry and reachability routing: where each wake-up goes under FENCED_ROUTING=reach."""
