"""Pure algorithms: no sockets, each tested on its own. Roles feed them messages and the
clock and act on what they return."""
