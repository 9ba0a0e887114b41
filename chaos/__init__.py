"""The chaos suite: kill, freeze and wipe real workers and stores, then judge every run (`fenced chaos`)."""
