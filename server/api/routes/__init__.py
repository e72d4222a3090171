"""One router per resource; ``neffcache.server.app`` includes them all."""
