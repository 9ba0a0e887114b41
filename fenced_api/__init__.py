"""The HTTP front door: `fenced api` serves the JSON API, the live event stream and the dashboard.

Stateless (every answer comes from the run store and Redis), so any number of replicas serve the same
clients. A roof like the CLI: it calls tasks.service (an app's own extras, such as the shopping example's
cart cards, reach it through the service's registry), and nothing below imports it.
"""
