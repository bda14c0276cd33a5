"""The live training page: what a fit publishes (:mod:`.publishing`) and the page the scheduler
serves from it (:mod:`.server`, with its HTML, script and style sheet in ``static/``).

``"adadamp.dashboard"`` in ``distributed.scheduler.http.routes`` serves the page (:data:`routes`).
"""

from .publishing import Publisher, opener, short_params
from .server import CSP, TOPIC, PageRoutes, fit_data, fit_list, page_html, routes, serve

__all__ = ["CSP", "TOPIC", "PageRoutes", "Publisher", "fit_data", "fit_list", "opener", "page_html", "routes", "serve",
           "short_params"]
