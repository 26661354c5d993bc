// The nexus console: a client of the HTTP doors (docs/console.md). The member token lives in
// this tab's sessionStorage and goes out as a bearer header; never in a cookie or a URL. Every
// value from the server is put into the page as text, never as markup.
'use strict';

const TOKEN = 'nexus.token';
const QUIET = ['completed', 'canceled', 'needs_attention'];
const SETTLED = ['completed', 'failed', 'canceled', 'timed_out', 'uncertain', 'skipped'];

/** An element: `h('td', {class: 'mono'}, 'text', child)`. Strings become text nodes. */
function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function status(word) {
  return h('span', {class: `status ${word || ''}`, 'data-status': word || ''}, word || '-');
}

function age(ms) {
  if (!ms) return '-';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 120) return `${s}s ago`;
  if (s < 7200) return `${Math.round(s / 60)}m ago`;
  if (s < 172800) return `${Math.round(s / 3600)}h ago`;
  return `${Math.round(s / 86400)}d ago`;
}

function short(id) {
  return id ? String(id).slice(0, 8) : '-';
}

function preview(value, chars) {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  if (text === undefined) return '';
  return text.length > chars ? text.slice(0, chars) + '…' : text;
}

/** The doors, with this tab's token. A refusal throws `{code, message}`. */
const api = {
  token() { return sessionStorage.getItem(TOKEN); },
  async call(method, path, body) {
    const response = await fetch(path, {
      method,
      headers: {authorization: `Bearer ${api.token()}`, 'content-type': 'application/json'},
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({}));
    if (response.status === 401 && api.token()) {
      sessionStorage.removeItem(TOKEN);
      route();
    }
    if (!response.ok) throw Object.assign(new Error(answer.message || response.statusText), {code: answer.code || response.status});
    return answer;
  },
  get(path) { return api.call('GET', path); },
  post(path, body) { return api.call('POST', path, body || {}); },

  /**
   * Follows an execution's events from `after` until it is quiet or `signal` aborts, calling
   * `onEvent({id, event, data})` for each. A cut stream (a dropped connection, a node that
   * stops) is followed again from the last cursor, so nothing is missed or shown twice.
   */
  async follow(id, after, onEvent, signal) {
    let cursor = after || '';
    for (let attempt = 0; !signal.aborted; attempt++) {
      try {
        const query = cursor ? `?after=${encodeURIComponent(cursor)}` : '';
        const response = await fetch(`/agent_api/v1/executions/${id}/events/stream${query}`,
          {headers: {authorization: `Bearer ${api.token()}`}, signal});
        if (response.status === 401) { sessionStorage.removeItem(TOKEN); route(); return; }
        // A refusal that waiting does not mend (not found, not authorized): stop following.
        if (response.status >= 400 && response.status < 500 && response.status !== 429) {
          const refused = await response.json().catch(() => ({}));
          onEvent({id: '', event: 'refused', data: refused});
          return;
        }
        if (!response.ok) throw new Error(`the event stream answered ${response.status}`);
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = '';
        let ended = false;
        for (;;) {
          const {value, done} = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, {stream: true}).replace(/\r\n/g, '\n');
          let at;
          while ((at = buffer.indexOf('\n\n')) >= 0) {
            const block = buffer.slice(0, at);
            buffer = buffer.slice(at + 2);
            const event = parseBlock(block);
            if (!event) continue;
            if (event.id) cursor = event.id;
            if (event.event === 'error') { ended = true; break; }
            attempt = 0;
            onEvent(event);
          }
          if (ended) break;
        }
        const shown = await api.get(`/agent_api/v1/executions/${id}`);
        if (QUIET.includes(shown.status) && !ended) return;
      } catch (error) {
        if (signal.aborted) return;
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 250 * 2 ** attempt)));
    }
  },
};

function parseBlock(block) {
  let id = '', event = 'message', data = '', any = false;
  for (const line of block.split('\n')) {
    const colon = line.indexOf(':');
    if (colon === 0) continue;
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'id') id = value;
    else if (field === 'event') event = value;
    else if (field === 'data') { data += (any ? '\n' : '') + value; any = true; }
  }
  if (!any) return null;
  try { return {id, event, data: JSON.parse(data)}; } catch { return {id, event, data}; }
}

// ---- pages -------------------------------------------------------------------------------

/** What the page being shown holds open (timers, streams); closed when another is shown. */
let leaving = new AbortController();

function every(ms, fn) {
  const timer = setInterval(fn, ms);
  leaving.signal.addEventListener('abort', () => clearInterval(timer));
  fn();
}

function page(title, ...children) {
  const main = document.getElementById('main');
  main.replaceChildren(h('h1', {}, title), ...children);
}

function failure(error) {
  return h('div', {class: 'error', role: 'alert'}, `${error.code || 'error'}: ${error.message}`);
}

function signin() {
  const token = h('input', {id: 'token', type: 'password', autocomplete: 'off', placeholder: 'member token'});
  const said = h('div', {class: 'error', id: 'signin-error'});
  const form = h('form', {class: 'signin', onsubmit: async (event) => {
    event.preventDefault();
    const typed = token.value.trim();
    const response = await fetch('/agent_api/v1/conversations?limit=1', {headers: {authorization: `Bearer ${typed}`}}).catch(() => null);
    if (!response || !response.ok) {
      const refused = response ? await response.json().catch(() => ({})) : {code: 'unavailable', message: 'nexus cannot be reached'};
      said.textContent = `${refused.code || response.status}: ${refused.message || ''}`;
      return;
    }
    sessionStorage.setItem(TOKEN, typed);
    // Where the person was going, or the executions.
    const target = location.hash && location.hash !== '#/signin' ? location.hash : '#/executions';
    if (location.hash === target) route(); else location.hash = target;
  }},
  h('h1', {}, 'Sign in'),
  h('p', {class: 'muted'}, 'Paste a member token (an Agent\'s or a Human\'s). It is kept in this tab only.'),
  token, h('button', {id: 'sign-in', type: 'submit'}, 'Sign in'), said);
  document.getElementById('main').replaceChildren(form);
  token.focus();
}

function executions() {
  const filter = h('select', {id: 'status-filter'}, h('option', {value: ''}, 'any status'),
    ['pending', 'running', 'paused', 'needs_attention', 'canceling', 'completed', 'canceled']
      .map((s) => h('option', {value: s}, s)));
  const conversation = h('input', {id: 'conversation-filter', placeholder: 'conversation id'});
  const body = h('tbody', {id: 'executions'});
  const said = h('div');
  const load = async () => {
    let path = '/agent_api/v1/executions?limit=100';
    if (filter.value) path += `&status=${filter.value}`;
    const wanted = conversation.value.trim().toLowerCase();
    if (wanted && !/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/.test(wanted)) {
      said.replaceChildren(failure({code: 'parameter_invalid', message: 'the conversation filter takes a conversation id (a UUID)'}));
      body.replaceChildren();
      return;
    }
    if (wanted) path += `&conversation=${wanted}`;
    try {
      const listed = await api.get(path);
      said.replaceChildren();
      body.replaceChildren(...listed.executions.map((e) => h('tr', {'data-execution': e.execution_public_id},
        h('td', {class: 'mono'}, h('a', {href: `#/executions/${e.execution_public_id}`}, short(e.execution_public_id))),
        h('td', {}, status(e.status)),
        h('td', {class: 'mono'}, h('a', {href: `#/conversations/${e.conversation_public_id}`}, short(e.conversation_public_id))),
        h('td', {}, e.turn), h('td', {}, e.round),
        h('td', {}, e.error_key || e.attention_reason || ''),
        h('td', {}, age(e.created_at)))));
    } catch (error) { said.replaceChildren(failure(error)); body.replaceChildren(); }
  };
  filter.addEventListener('change', load);
  conversation.addEventListener('change', load);
  page('Executions', h('div', {class: 'filters'}, filter, conversation), said,
    h('table', {}, h('thead', {}, h('tr', {}, ['Execution', 'Status', 'Conversation', 'Turn', 'Round', 'Error', 'Age'].map((t) => h('th', {}, t)))), body));
  every(2000, load);
}

/** The timeline: one lane per runner (and one for nexus's own calls), one bar per task from its
 *  first event (parked, dispatched or running) to its settlement (or now), coloured by its
 *  status; the time it waited for a person is the lighter part at its start. Calls that overlap
 *  on one lane take rows of their own. */
function timeline(tasks) {
  const list = Object.values(tasks).filter((t) => t.start).sort((a, b) => a.start - b.start);
  const width = 1100, row = 22, left = 170, top = 22, gap = 8;
  const now = Date.now();
  const lanes = [];
  for (const task of list) {
    let lane = lanes.find((l) => l.name === task.lane);
    if (!lane) lanes.push(lane = {name: task.lane, rows: []});
    const end = task.end || now;
    let at = lane.rows.findIndex((busyUntil) => busyUntil < task.start);
    if (at < 0) { at = lane.rows.length; lane.rows.push(0); }
    lane.rows[at] = end;
    task.row = at;
  }
  const heights = lanes.map((l) => Math.max(1, l.rows.length) * row + gap);
  const height = top + heights.reduce((a, b) => a + b, 0) + 4;
  const chart = svg('svg', {class: 'timeline', id: 'timeline', width: '100%', viewBox: `0 0 ${width} ${Math.max(height, 40)}`, 'data-bars': list.length});
  if (!list.length) {
    chart.append(svg('text', {x: 12, y: 20}, 'no calls yet'));
    return chart;
  }
  const from = list[0].start;
  const to = Math.max(...list.map((t) => t.end || now), from + 1000);
  const x = (ms) => left + ((ms - from) / (to - from)) * (width - left - 12);
  chart.append(svg('text', {x: left, y: 14}, '0 s'), svg('text', {x: width - 60, y: 14}, `${((to - from) / 1000).toFixed(1)} s`));
  let y = top;
  lanes.forEach((lane, i) => {
    chart.append(svg('text', {x: 8, y: y + 16}, lane.name === 'nexus' ? 'nexus (kernel)' : `runner ${short(lane.name)}`),
      svg('line', {x1: 0, x2: width, y1: y + heights[i] - 2, y2: y + heights[i] - 2, stroke: '#dde2ea'}));
    for (const task of list.filter((t) => t.lane === lane.name)) {
      const top = y + 3 + task.row * row;
      const start = x(task.start), end = Math.max(start + 4, x(task.end || now));
      const took = task.end ? ` in ${((task.end - task.start) / 1000).toFixed(2)} s` : '';
      chart.append(svg('rect', {class: `bar status-${task.status}`, 'data-task': task.key, 'data-status': task.status,
        x: start, y: top, width: end - start, height: row - 6},
        svg('title', {}, `${task.key} ${task.tool}: ${task.status}${took}`)));
      if (task.decided) {
        const waited = Math.min(end, x(task.decided)) - start;
        if (waited > 1) chart.append(svg('rect', {class: 'waited', x: start, y: top, width: waited, height: row - 6},
          svg('title', {}, `${task.key} waited ${((task.decided - task.start) / 1000).toFixed(2)} s for a person`)));
      }
      if (end - start > 70) chart.append(svg('text', {x: start + 4, y: top + 12, class: 'on-bar'}, `${task.key} ${task.tool}`));
    }
    y += heights[i];
  });
  return chart;
}

/** An execution's view with every page of its tasks (`tasks_next`, at most 50 pages). */
async function allTasks(id) {
  const view = await api.get(`/agent_api/v1/executions/${id}`);
  for (let page = 0; view.tasks_next && page < 50; page++) {
    const more = await api.get(`/agent_api/v1/executions/${id}?tasks_after=${encodeURIComponent(view.tasks_next)}`);
    view.tasks = view.tasks.concat(more.tasks || []);
    view.tasks_next = more.tasks_next;
  }
  return view;
}

/** A time as a person reads it: the time of day today, else the date too. */
function when(ms) {
  const at = new Date(ms);
  return at.toDateString() === new Date().toDateString() ? at.toLocaleTimeString() : at.toLocaleString();
}

function execution(id) {
  const facts = h('dl', {class: 'facts', id: 'facts'});
  const controls = h('div', {class: 'controls', id: 'controls'});
  const said = h('div');
  const chart = h('div', {id: 'chart'});
  const taskRows = h('tbody', {id: 'tasks'});
  const answer = h('div', {class: 'answer', id: 'answer', hidden: true});
  const log = h('div', {class: 'events', id: 'events'});
  const tasks = {};
  // Each call's input, from the events that carry it (`round_result`, `approval_required`).
  const inputs = {};
  // What is being typed into an answer field, kept across the table's refreshes.
  const typing = {};
  let view = null;

  const act = (label, door, body, allowed) => h('button', {type: 'button', 'data-action': door, disabled: !allowed, onclick: async (event) => {
    event.target.disabled = true;
    try {
      said.replaceChildren();
      const answered = await api.post(`/agent_api/v1/executions/${id}/${door}`, body);
      // A regeneration is a new execution: show it.
      if (door === 'regenerate' && answered.execution_public_id) { location.hash = `#/executions/${answered.execution_public_id}`; return; }
    } catch (error) { said.replaceChildren(failure(error)); }
    refresh();
  }}, label);

  const render = () => {
    const e = view;
    facts.replaceChildren(
      h('dt', {}, 'Status'), h('dd', {id: 'execution-status', 'data-status': e.status}, status(e.status)),
      h('dt', {}, 'Conversation'), h('dd', {class: 'mono'}, h('a', {href: `#/conversations/${e.conversation_public_id}`}, e.conversation_public_id)),
      h('dt', {}, 'Round'), h('dd', {}, e.round),
      h('dt', {}, 'Default runner'), h('dd', {class: 'mono'}, e.default_runner_executor_public_id || '-'),
      h('dt', {}, 'Budget'), h('dd', {}, e.budget ? preview(e.budget.used || e.budget, 120) : 'none'),
      h('dt', {}, 'Error'), h('dd', {}, e.error_key || e.attention_reason || '-'),
      h('dt', {}, 'Created'), h('dd', {}, age(e.created_at)));
    const s = e.status;
    controls.replaceChildren(
      act('Pause', 'pause', {}, s === 'running'),
      act('Resume', 'resume', {}, s === 'paused'),
      act('Stop', 'stop', {}, ['pending', 'running', 'paused'].includes(s)),
      act('Regenerate', 'regenerate', {}, QUIET.includes(s)));
    taskRows.replaceChildren(...(e.tasks || []).map((t) => {
      const decide = [];
      const base = `/agent_api/v1/executions/${id}/tasks/${t.task_key}`;
      if (t.status === 'needs_approval') {
        decide.push(h('button', {type: 'button', 'data-approve': t.task_key, disabled: s !== 'running', onclick: () => decideTask(`${base}/approve`, {})}, 'Approve'),
          ' ', h('button', {type: 'button', class: 'secondary', 'data-deny': t.task_key, disabled: s !== 'running', onclick: () => {
            const reason = window.prompt('Why deny it? The model reads this (optional).', '');
            if (reason !== null) decideTask(`${base}/deny`, reason ? {reason} : {});
          }}, 'Deny'));
      }
      if (t.status === 'awaiting_input') {
        const asked = inputs[t.task_key] || {};
        const options = Array.isArray(asked.options) ? asked.options : [];
        const field = options.length
          ? h('select', {'data-answer-input': t.task_key, multiple: !!asked.multi}, options.map((o) => h('option', {value: o}, o)))
          : h('input', {placeholder: 'answer', 'data-answer-input': t.task_key});
        if (typing[t.task_key] !== undefined && !options.length) field.value = typing[t.task_key];
        field.addEventListener('input', () => { typing[t.task_key] = field.value; });
        const value = () => asked.multi ? [...field.selectedOptions].map((o) => o.value) : field.value;
        decide.push(field, ' ', h('button', {type: 'button', 'data-answer': t.task_key, onclick: () => { delete typing[t.task_key]; decideTask(`${base}/answer`, {answer: value()}); }}, 'Answer'));
      }
      const result = t.result && (t.result.content !== undefined ? t.result.content : t.result);
      return h('tr', {'data-task': t.task_key},
        h('td', {class: 'mono'}, t.task_key), h('td', {}, t.tool_name), h('td', {}, status(t.status)),
        h('td', {class: 'mono'}, short(t.runner_executor_public_id)),
        h('td', {}, h('pre', {}, preview(inputs[t.task_key] === undefined ? '' : inputs[t.task_key], 400))),
        h('td', {}, h('pre', {}, t.error_message || preview(result === undefined || result === null ? '' : result, 600))),
        h('td', {}, decide));
    }));
    answer.hidden = !e.final_text;
    answer.textContent = e.final_text || '';
    chart.replaceChildren(timeline(tasks));
  };

  const decideTask = async (path, body) => {
    try { said.replaceChildren(); await api.post(path, body); } catch (error) { said.replaceChildren(failure(error)); }
    refresh();
  };

  let pending = null;
  const refresh = () => {
    clearTimeout(pending);
    pending = setTimeout(async () => {
      try { view = await allTasks(id); render(); } catch (error) { said.replaceChildren(failure(error)); }
    }, 150);
  };

  const onEvent = (event) => {
    const d = (event.data && event.data.data) || {};
    const at = event.data && event.data.at;
    if (event.event === 'task_status' && d.task_key && !d.failure_resolution) {
      const task = tasks[d.task_key] || (tasks[d.task_key] = {key: d.task_key, tool: d.tool_name, lane: d.runner_executor_public_id || 'nexus'});
      if (!task.start && !['waiting'].includes(d.status)) task.start = at;
      // The moment a person decided a parked call (or answered a question).
      if (['needs_approval', 'awaiting_input'].includes(task.status) && !['needs_approval', 'awaiting_input'].includes(d.status)) task.decided = at;
      task.status = d.status;
      if (d.runner_executor_public_id) task.lane = d.runner_executor_public_id;
      if (SETTLED.includes(d.status)) task.end = at;
    }
    if (event.event === 'round_result') for (const call of d.tool_calls || []) inputs[call.task_key] = call.input;
    if (event.event === 'approval_required') inputs[d.task_key] = d.tool_input;
    if (event.event === 'input_required') inputs[d.task_key] = {prompt: d.prompt, options: d.options, multi: d.multi};
    if (event.event === 'refused') { said.replaceChildren(failure({code: event.data.code, message: event.data.message})); return; }
    if (event.id) {
      log.prepend(h('div', {'data-cursor': event.id}, `${new Date(at).toLocaleTimeString()}  ${event.event}  ${preview(d, 160)}`));
      refresh();
    }
  };

  page('Execution', h('div', {class: 'mono muted'}, id), said, facts, controls,
    h('h2', {}, 'Timeline'), chart,
    h('h2', {}, 'Calls'),
    h('table', {}, h('thead', {}, h('tr', {}, ['Task', 'Tool', 'Status', 'Runner', 'Input', 'Result', ''].map((t) => h('th', {}, t)))), taskRows),
    h('h2', {}, 'Answer'), answer,
    h('h2', {}, 'Events'), log);
  refresh();
  api.follow(id, '', onEvent, leaving.signal);
  // The bars of open calls grow with the clock.
  every(1000, () => { if (view && !QUIET.includes(view.status)) chart.replaceChildren(timeline(tasks)); });
}

function waiting() {
  const body = h('tbody', {id: 'waiting'});
  const said = h('div');
  const load = async () => {
    try {
      const rows = [];
      // One read per live execution (at most 25 of each state), every 10 s: the doors have no
      // listing of parked calls across executions yet.
      for (const state of ['running', 'paused']) {
        const listed = await api.get(`/agent_api/v1/executions?status=${state}&limit=25`);
        for (const e of listed.executions) {
          const shown = await api.get(`/agent_api/v1/executions/${e.execution_public_id}`);
          const open = (shown.tasks || []).filter((t) => t.status === 'needs_approval' || t.status === 'awaiting_input');
          if (!open.length) continue;
          // What each waits on (the call's input, the question) is in its event.
          const asked = {};
          const events = await api.get(`/agent_api/v1/executions/${e.execution_public_id}/events?limit=200`);
          for (const item of events.items) {
            if (item.type === 'approval_required') asked[item.data.task_key] = item.data.tool_input;
            if (item.type === 'input_required') asked[item.data.task_key] = {prompt: item.data.prompt, options: item.data.options};
          }
          for (const t of open) {
            rows.push(h('tr', {'data-task': t.task_key},
              h('td', {class: 'mono'}, h('a', {href: `#/executions/${e.execution_public_id}`}, short(e.execution_public_id))),
              h('td', {}, t.status === 'needs_approval' ? 'approval' : 'question'),
              h('td', {class: 'mono'}, t.task_key), h('td', {}, t.tool_name),
              h('td', {}, h('pre', {}, preview(asked[t.task_key] === undefined ? '' : asked[t.task_key], 300))),
              h('td', {}, t.deadline_at ? `until ${when(t.deadline_at)}` : '-')));
          }
        }
      }
      said.replaceChildren();
      body.replaceChildren(...(rows.length ? rows : [h('tr', {}, h('td', {colspan: 6, class: 'muted'}, 'Nothing waits for a person.'))]));
    } catch (error) { said.replaceChildren(failure(error)); }
  };
  page('Waiting for you', said,
    h('table', {}, h('thead', {}, h('tr', {}, ['Execution', 'Kind', 'Task', 'Tool', 'Input', 'Hold'].map((t) => h('th', {}, t)))), body));
  every(10000, load);
}

function conversations() {
  const body = h('tbody', {id: 'conversations'});
  const said = h('div');
  page('Conversations', said,
    h('table', {}, h('thead', {}, h('tr', {}, ['Conversation', 'Turns', 'Last status', 'Last execution', 'Last turn'].map((t) => h('th', {}, t)))), body));
  every(3000, async () => {
    try {
      const listed = await api.get('/agent_api/v1/conversations?limit=100');
      said.replaceChildren();
      body.replaceChildren(...listed.conversations.map((c) => h('tr', {},
        h('td', {class: 'mono'}, h('a', {href: `#/conversations/${c.conversation_public_id}`}, short(c.conversation_public_id))),
        h('td', {}, c.turn_count), h('td', {}, status(c.last_status)),
        h('td', {class: 'mono'}, c.last_execution_public_id ? h('a', {href: `#/executions/${c.last_execution_public_id}`}, short(c.last_execution_public_id)) : '-'),
        h('td', {}, age(c.last_turn_at)))));
    } catch (error) { said.replaceChildren(failure(error)); }
  });
}

function conversation(id) {
  const turns = h('div', {id: 'turns'});
  const said = h('div');
  page('Conversation', h('div', {class: 'mono muted'}, id), said, turns);
  every(3000, async () => {
    try {
      const shown = await api.get(`/agent_api/v1/conversations/${id}`);
      said.replaceChildren();
      turns.replaceChildren(...shown.turns.map((t) => h('div', {class: 'turn'},
        h('h2', {}, `Turn ${t.turn} `, status(t.status), ' ', t.execution_public_id ? h('a', {href: `#/executions/${t.execution_public_id}`, class: 'mono'}, short(t.execution_public_id)) : ''),
        h('div', {class: 'answer'}, `> ${t.text}`),
        t.final_text ? h('div', {class: 'answer'}, t.final_text) : null)));
    } catch (error) { said.replaceChildren(failure(error)); }
  });
}

function runners() {
  const body = h('tbody', {id: 'runners'});
  const said = h('div');
  page('Runners', said,
    h('table', {}, h('thead', {}, h('tr', {}, ['Runner', 'Name', 'Presence', 'Last seen', 'Tools'].map((t) => h('th', {}, t)))), body));
  every(3000, async () => {
    try {
      const listed = await api.get('/agent_api/v1/executors?kind=runner');
      said.replaceChildren();
      body.replaceChildren(...listed.executors.map((r) => h('tr', {},
        h('td', {class: 'mono'}, r.public_id), h('td', {}, r.display_name), h('td', {}, status(r.presence)),
        h('td', {}, age(r.last_seen_at)),
        h('td', {}, (r.served_tools || []).map((t) => t.name || t).join(', ')))));
    } catch (error) { said.replaceChildren(failure(error)); }
  });
}

function route() {
  leaving.abort();
  leaving = new AbortController();
  const path = location.hash.replace(/^#/, '') || '/executions';
  const signedIn = !!api.token();
  document.getElementById('sign-out').hidden = !signedIn;
  for (const link of document.querySelectorAll('nav a')) link.classList.toggle('here', path.startsWith(link.getAttribute('href').slice(1)));
  if (!signedIn || path === '/signin') return signin();
  const [, section, id] = path.split('/');
  if (section === 'executions' && id) return execution(id);
  if (section === 'waiting') return waiting();
  if (section === 'conversations' && id) return conversation(id);
  if (section === 'conversations') return conversations();
  if (section === 'runners') return runners();
  return executions();
}

document.getElementById('sign-out').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN);
  location.hash = '#/signin';
});
window.addEventListener('hashchange', route);
route();
