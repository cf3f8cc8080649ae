"""The serving benchmark: requests at fixed rates against an endpoint, replayed call logs (README.md)."""
