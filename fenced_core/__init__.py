"""The floor: settings, errors and logging. Imported by every package of fenced; imports none of them."""
