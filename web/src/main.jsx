// longhaul's live view: the Perses rendering of our dashboards
// (dashboards/perses/, written by dashboards/generate.py) drawn by Perses's
// own components against the Prometheus that the web server proxies under
// /prometheus on this origin, or (pages under /central/) against the central
// store of many sites that it proxies under /central. No server of ours: the
// page, the dashboards and both APIs come from one nginx (roles/live_view).
import React, { createContext, useContext, useEffect, useMemo, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { BrowserRouter, Link, Navigate, Route, Routes, useLocation, useParams } from 'react-router-dom';
import { QueryParamProvider } from 'use-query-params';
import { ReactRouter6Adapter } from 'use-query-params/adapters/react-router-6';
import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { Alert, AppBar, Box, CssBaseline, Link as MuiLink, Tab, Tabs, ThemeProvider, Toolbar, Typography } from '@mui/material';
import { ChartsProvider, ErrorAlert, ErrorBoundary, generateChartsTheme, getTheme, LoadingOverlay, NoDataOverlay, SnackbarProvider } from '@perses-dev/components';
import { dynamicImportPluginLoader, PluginRegistry } from '@perses-dev/plugin-system';
import { ViewDashboard } from '@perses-dev/dashboards';
import * as prometheusPlugin from '@perses-dev/prometheus-plugin';
import * as timeSeriesChartPlugin from '@perses-dev/timeseries-chart-plugin';
import * as statChartPlugin from '@perses-dev/stat-chart-plugin';
import * as tablePlugin from '@perses-dev/table-plugin';
import * as statusHistoryChartPlugin from '@perses-dev/status-history-chart-plugin';
import { refreshBusyWhen } from './refresh.js';

// Prometheus's scrape interval in our roles (prometheus_scrape_interval): the
// least step of $__rate_interval, as in Grafana's data source.
const SCRAPE_INTERVAL = '15s';

// The stores the page reads, each a Prometheus API on this origin (nginx proxies
// it, with the viewer's own login passed on): this site's Prometheus, and the
// central store of many sites (roles/victoriametrics: the first replica that
// answers), whose pages are those under /central/. The web server says in
// /live-view.json whether it has a central store.
// A store's `waitMs`: how long its health check waits for an answer (nginx asks
// the central store's replicas in turn, each given 3 s to connect).
const STORES = {
  site: { key: 'site', pages: '', api: '/prometheus', label: 'Site', what: 'Prometheus', waitMs: 5000 },
  central: { key: 'central', pages: '/central', api: '/central', label: 'Central', what: 'The central store', waitMs: 10000 },
};

function storeOf(pathname) {
  return pathname === '/central' || pathname.startsWith('/central/') ? STORES.central : STORES.site;
}

// The one data source every dashboard of a store reads, and its answers' cache:
// one per store, as the queries of both stores are the same and so are their keys.
function sourceOf(store) {
  const datasource = {
    kind: 'GlobalDatasource',
    metadata: { name: 'prometheus' },
    spec: {
      default: true,
      plugin: { kind: 'PrometheusDatasource', spec: { directUrl: store.api, scrapeInterval: SCRAPE_INTERVAL } },
    },
  };
  const queries = newQueryClient();
  let answeredAt = 0;
  // the store's own answers: a panel's query or a variable's values (a plugin's
  // or data source's lookup is answered by the page itself)
  queries.getQueryCache().subscribe((event) => {
    if (event.type !== 'updated' || event.action.type !== 'success') return;
    const kind = event.query.queryKey[0]?.kind;
    if (kind === 'TimeSeriesQuery' || kind === 'ListVariable') answeredAt = Date.now();
  });
  return {
    api: {
      buildProxyUrl: () => store.api,
      getDatasource: () => Promise.resolve(undefined),
      getGlobalDatasource: () => Promise.resolve(datasource),
      listDatasources: () => Promise.resolve([]),
      listGlobalDatasources: () => Promise.resolve([datasource]),
    },
    queries,
    // when a query of this store last got its answer (a health check that waited
    // longer is no news of the store: see askStore)
    answeredAt: () => answeredAt,
  };
}

// Whether the store (Prometheus, or the central store) answers, asked every few
// seconds apart from the panels' own queries: a panel whose query fails after it
// had drawn keeps its old drawing in Perses (the error only as an icon in its
// header, or late on a busy page), so while the store does not answer every panel
// says so instead, in words. "Away" is what says the store is: no answer,
// 502/503/504 (our nginx's JSON when it gets none), twice in a row so one lost
// request blanks nothing. A refused login (401) says so; a request over the rate
// limit (429) is no news about the store.
const HEALTH_EVERY_MS = 5000;
const PrometheusAway = createContext(null);

// A check that got no answer in its time while a panel's query to the same store
// got one is no news of the store: the check waited in the browser's queue (six
// requests at a time to one origin over HTTP/1.1) behind a dashboard's queries to
// a slow store, which is there.
async function askStore(store) {
  const sent = Date.now();
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), store.waitMs);
  try {
    const response = await fetch(`${store.api}/api/v1/status/buildinfo`, {
      credentials: 'same-origin',
      signal: abort.signal,
    });
    if (response.ok || response.status === 429) return { away: null };
    if (response.status === 401) {
      return { away: `${store.what} refused the login (401): reload the page and log in again, as a user it knows.`, now: true };
    }
    const body = await response.json().catch(() => ({}));
    if ([502, 503, 504].includes(response.status)) {
      return { away: body.error || `${store.what} does not answer the live view (${response.status})` };
    }
    return { away: null };
  } catch (error) {
    if (SOURCES[store.key].answeredAt() >= sent) return { away: null };
    const late = `no answer in ${store.waitMs / 1000} s`;
    return { away: `${store.what} does not answer the live view: ${error.name === 'AbortError' ? late : error.message}` };
  } finally {
    clearTimeout(timer);
  }
}

function useStoreAway(store) {
  const [away, setAway] = useState(null);
  useEffect(() => {
    let live = true;
    let timer;
    let failures = 0;
    setAway(null);
    const ask = async () => {
      const { away: problem, now } = await askStore(store);
      if (!live) return;
      failures = problem ? failures + 1 : 0;
      setAway(problem && (now || failures >= 2) ? problem : null);
      timer = setTimeout(ask, HEALTH_EVERY_MS);
    };
    ask();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [store]);
  return away;
}

function AwayOr(Component) {
  return function Guarded(props) {
    const away = useContext(PrometheusAway);
    if (away) {
      return (
        <Alert severity="error" data-testid="prometheus-away" sx={{ m: 1 }}>
          {away}
        </Alert>
      );
    }
    return <Component {...props} />;
  };
}

// Perses's Table draws an empty frame when its queries return no series; ours says
// "No data" as every other panel does (a firing-alerts table with none firing).
function TableOrNoData(props) {
  const rows = (props.queryResults || []).reduce((count, result) => count + ((result.data && result.data.series) || []).length, 0);
  if (rows === 0 && (props.queryResults || []).every((result) => result.data)) {
    return <NoDataOverlay resource="data" />;
  }
  return <tablePlugin.Table.PanelComponent {...props} />;
}

// A plugin module whose panel `kind` says when Prometheus is away (and draws
// through `component` when given), whether it had drawn or was still waiting
// for its first answer: Perses draws a waiting panel (no data, its query in
// flight) with its LoadingComponent, by default a skeleton, and with a refresh
// every few seconds some panel always would be one, saying nothing.
function withPanel(module, kind, component) {
  const panel = module[kind];
  return {
    ...module,
    [kind]: {
      ...panel,
      PanelComponent: AwayOr(component || panel.PanelComponent),
      LoadingComponent: AwayOr(panel.LoadingComponent || LoadingOverlay),
    },
  };
}

const plugins = [
  prometheusPlugin,
  withPanel(timeSeriesChartPlugin, 'TimeSeriesChart'),
  withPanel(statChartPlugin, 'StatChart'),
  withPanel(tablePlugin, 'Table', TableOrNoData),
  withPanel(statusHistoryChartPlugin, 'StatusHistoryChart'),
];
const pluginLoader = dynamicImportPluginLoader(
  plugins.map((plugin) => ({ resource: plugin.getPluginModule(), importPlugin: () => Promise.resolve(plugin) }))
);

// Refetches follow the time range and the refresh interval (Perses's refresh
// key), not react-query's staleness: with staleTime 0 a panel whose variable
// is still loading asks twice per refresh (once before, once after).
// keepPreviousData: each refresh is a new query (its time range is in the key);
// without it every panel blanks to a skeleton until its new answer, and on a
// busy Prometheus (answers slower than the refresh) never draws at all. A
// failed query still shows its error (react-query keeps no data over an error).
// A query that got no answer at all (fetch's TypeError: the host's network
// changed under the request, a laptop between networks) is asked once more a
// second later before its panel shows the error; an answer, even an error
// (502: the store is away), is the answer.
function newQueryClient() {
  return new QueryClient({
    defaultOptions: {
      queries: {
        refetchOnWindowFocus: false,
        retry: (failures, error) => failures < 1 && error instanceof TypeError,
        retryDelay: 1000,
        staleTime: Infinity,
        keepPreviousData: true,
      },
    },
  });
}
const queryClient = newQueryClient();
const SOURCES = { site: sourceOf(STORES.site), central: sourceOf(STORES.central) };
// A dashboard's refresh waits while the page's last queries (either store's) are in flight (src/refresh.js).
refreshBusyWhen(() => SOURCES.site.queries.isFetching() + SOURCES.central.queries.isFetching() > 0);

const muiTheme = getTheme('light');
const chartsTheme = generateChartsTheme(muiTheme, {});

async function fetchJson(path) {
  const response = await fetch(path, { credentials: 'same-origin' });
  if (!response.ok) {
    throw new Error(`${path}: ${response.status} ${response.statusText}`);
  }
  return response.json();
}

function useJson(path) {
  const [state, setState] = useState({ data: undefined, error: undefined });
  useEffect(() => {
    let live = true;
    setState({ data: undefined, error: undefined });
    fetchJson(path).then(
      (data) => live && setState({ data, error: undefined }),
      (error) => live && setState({ data: undefined, error })
    );
    return () => {
      live = false;
    };
  }, [path]);
  return state;
}

function Message({ children }) {
  return (
    <Box sx={{ p: 4 }} data-testid="live-view-message">
      <Typography variant="h6">{children}</Typography>
    </Box>
  );
}

// The dashboard's time range and refresh in the URL before Perses reads it:
// Perses writes them there itself on its first render when they are missing,
// and that write makes it compute the time range again, so every variable and
// panel asked Prometheus twice on each page load (measured: two waves of label
// requests a second apart before the first panel query).
function withDefaults(search, spec) {
  const params = new URLSearchParams(search);
  const given = params.toString();
  if (!params.has('start') && spec.duration) {
    // an end without a start means nothing to Perses; it would go on to other tabs
    params.delete('end');
    params.set('start', spec.duration);
  }
  if (!params.has('refresh') && spec.refreshInterval) params.set('refresh', spec.refreshInterval);
  return params.toString() === given ? null : `?${params.toString()}`;
}

function DashboardPage({ store }) {
  const { name } = useParams();
  const location = useLocation();
  const { data, error } = useJson(`/dashboards/${encodeURIComponent(name)}.json`);
  if (error) return <Message>Dashboard {name} could not be loaded: {error.message}</Message>;
  if (!data) return <Message>Loading {name}…</Message>;
  const search = withDefaults(location.search, data.spec);
  if (search !== null) return <Navigate to={{ pathname: location.pathname, search, hash: location.hash }} replace />;
  const source = SOURCES[store.key];
  return (
    <ErrorBoundary FallbackComponent={ErrorAlert}>
      <QueryClientProvider client={source.queries}>
        <ViewDashboard
          key={`${store.key}/${name}`}
          dashboardResource={data}
          datasourceApi={source.api}
          isReadonly={true}
          isVariableEnabled={true}
          isDatasourceEnabled={false}
          isInitialVariableSticky={true}
          dashboardTitleComponent={
            <Typography variant="h2" component="h1" data-testid="dashboard-title">
              {data.spec.display.name}
            </Typography>
          }
          sx={{ height: 'calc(100vh - 48px)' }}
        />
      </QueryClientProvider>
    </ErrorBoundary>
  );
}

// The same dashboard of the other store (the site's page of a central one and
// back), with the time range and refresh kept.
function otherStore(location, store, other) {
  const page = location.pathname.slice(store.pages.length);
  return { pathname: `${other.pages}${page.startsWith('/d/') ? page : '/'}`, search: keepTime(location.search) };
}

function Navigation({ index, store, central }) {
  const location = useLocation();
  const current = index.find((entry) => location.pathname === `${store.pages}/d/${entry.name}`);
  return (
    <AppBar position="static" color="default" elevation={1}>
      <Toolbar variant="dense" sx={{ gap: 2 }}>
        <Typography variant="subtitle1" component="span" sx={{ fontWeight: 600 }}>
          longhaul live view
        </Typography>
        {central && (
          <Tabs value={store.key} data-testid="store-switch" aria-label="store">
            {[STORES.site, STORES.central].map((other) => (
              <Tab key={other.key} value={other.key} label={other.label} component={Link} to={otherStore(location, store, other)} />
            ))}
          </Tabs>
        )}
        <Tabs value={current ? current.name : false} variant="scrollable" scrollButtons="auto">
          {index.map((entry) => (
            // Keep the time range and refresh; variables differ per dashboard.
            <Tab
              key={entry.name}
              value={entry.name}
              label={entry.title}
              component={Link}
              to={{ pathname: `${store.pages}/d/${entry.name}`, search: keepTime(location.search) }}
            />
          ))}
        </Tabs>
        <Box sx={{ flexGrow: 1 }} />
        <MuiLink href={`${store.api}/api/v1/status/buildinfo`} underline="hover" variant="caption">
          {store.key === 'central' ? 'Central store API' : 'Prometheus API'}
        </MuiLink>
      </Toolbar>
    </AppBar>
  );
}

function keepTime(search) {
  const from = new URLSearchParams(search);
  const kept = new URLSearchParams();
  for (const key of ['start', 'end', 'refresh']) {
    if (from.has(key)) kept.set(key, from.get(key));
  }
  const text = kept.toString();
  return text ? `?${text}` : '';
}

// What the web server has (roles/live_view writes it): whether a central store is
// behind /central. A server without it (an older role: 404, or the application's
// page instead of JSON) has none; any other failure (a 429, no answer) is asked
// again a few seconds later, meanwhile as if there were none.
const SERVER_RETRY_MS = 5000;

function useServer() {
  const [server, setServer] = useState(undefined);
  useEffect(() => {
    let live = true;
    let timer;
    const ask = async () => {
      let known = null;
      try {
        const response = await fetch('/live-view.json', { credentials: 'same-origin' });
        if (response.status === 404) known = { central: false };
        else if (response.ok) known = await response.json().then((data) => ({ central: data.central === true }), () => ({ central: false }));
      } catch (error) {
        known = null;
      }
      if (!live) return;
      setServer(known || { central: false, unsure: true });
      if (!known) timer = setTimeout(ask, SERVER_RETRY_MS);
    };
    ask();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, []);
  return server;
}

function App() {
  const location = useLocation();
  const store = storeOf(location.pathname);
  const away = useStoreAway(store);
  const server = useServer();
  const { data: index, error } = useJson('/dashboards/index.json');
  const first = useMemo(() => (index && index.length ? index[0].name : undefined), [index]);
  if (error) return <Message>The list of dashboards could not be loaded: {error.message}</Message>;
  if (!index || !server) return <Message>Loading…</Message>;
  if (store.key === 'central' && !server.central) {
    if (server.unsure) return <Message>Asking the web server whether it has a central store…</Message>;
    return <Message>This live view has no central store (its web server proxies none): open the site's pages at /.</Message>;
  }
  const start = first ? <Navigate to={`${store.pages}/d/${first}`} replace /> : <Message>No dashboards.</Message>;
  return (
    <PrometheusAway.Provider value={away}>
      <Navigation index={index} store={store} central={server.central} />
      <Routes>
        <Route path="/d/:name" element={<DashboardPage store={STORES.site} />} />
        <Route path="/central/d/:name" element={<DashboardPage store={STORES.central} />} />
        <Route path="*" element={start} />
      </Routes>
    </PrometheusAway.Provider>
  );
}

createRoot(document.getElementById('root')).render(
  <React.StrictMode>
    <ThemeProvider theme={muiTheme}>
      <CssBaseline />
      <ChartsProvider chartsTheme={chartsTheme}>
        <SnackbarProvider anchorOrigin={{ vertical: 'bottom', horizontal: 'right' }} variant="default" content="">
          <QueryClientProvider client={queryClient}>
            <PluginRegistry pluginLoader={pluginLoader} defaultPluginKinds={{ Panel: 'TimeSeriesChart', TimeSeriesQuery: 'PrometheusTimeSeriesQuery' }}>
              <BrowserRouter>
                <QueryParamProvider adapter={ReactRouter6Adapter}>
                  <App />
                </QueryParamProvider>
              </BrowserRouter>
            </PluginRegistry>
          </QueryClientProvider>
        </SnackbarProvider>
      </ChartsProvider>
    </ThemeProvider>
  </React.StrictMode>
);
