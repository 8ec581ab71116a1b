#include "tests/apiserver/table.h"

#include <ctime>

namespace spawnpoint::kubetest {
namespace {

json Column(const std::string& name, const std::string& type, const std::string& format,
            const std::string& description, int priority = 0) {
  return {{"name", name},
          {"type", type},
          {"format", format},
          {"description", description},
          {"priority", priority}};
}

const char* kNameDescription =
    "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition.";
const char* kAgeDescription =
    "CreationTimestamp is a timestamp representing the server time when this object was "
    "created.";

std::string CreationAge(const json& obj) {
  return AgeOf(obj.value("metadata", json::object()).value("creationTimestamp", ""));
}

// Columns and cells for the built-ins whose kubectl output people read.
void BuiltinColumns(const ResourceInfo& info, json* columns) {
  columns->push_back(Column("Name", "string", "name", kNameDescription));
  if (info.group.empty() && info.plural == "pods") {
    columns->push_back(Column("Ready", "string", "",
                              "The aggregate readiness state of this pod for accepting traffic."));
    columns->push_back(
        Column("Status", "string", "", "The aggregate status of the containers in this pod."));
    columns->push_back(Column("Restarts", "string", "",
                              "The number of times the containers in this pod have been "
                              "restarted and when the last container in this pod has restarted."));
    columns->push_back(Column("Age", "string", "", kAgeDescription));
    columns->push_back(Column("IP", "string", "", "IP address allocated to the pod.", 1));
    columns->push_back(Column("Node", "string", "", "Name of the Node the Pod is assigned to.", 1));
  } else if (info.group.empty() && (info.plural == "namespaces" || info.plural == "nodes")) {
    columns->push_back(Column("Status", "string", "", "The status of the object."));
    columns->push_back(Column("Age", "string", "", kAgeDescription));
  } else {
    columns->push_back(Column("Age", "string", "", kAgeDescription));
  }
}

json BuiltinCells(const ResourceInfo& info, const json& obj) {
  const json meta = obj.value("metadata", json::object());
  json cells = json::array({meta.value("name", "")});
  const json status = obj.value("status", json::object());
  if (info.group.empty() && info.plural == "pods") {
    // kubectl's pod STATUS: the phase, overridden by a container's waiting or terminated
    // reason (last container first), and Terminating while being deleted.
    const json statuses = status.value("containerStatuses", json::array());
    size_t total = obj.value("spec", json::object()).value("containers", json::array()).size();
    int ready = 0, restarts = 0;
    bool has_running = false;
    std::string reason = status.value("reason", status.value("phase", "Pending"));
    for (auto it = statuses.rbegin(); it != statuses.rend(); ++it) {
      const json& cs = *it;
      restarts += cs.value("restartCount", 0);
      const json state = cs.value("state", json::object());
      if (state.contains("waiting") && !state["waiting"].value("reason", "").empty()) {
        reason = state["waiting"].value("reason", "");
      } else if (state.contains("terminated")) {
        const json& t = state["terminated"];
        if (!t.value("reason", "").empty()) {
          reason = t.value("reason", "");
        } else if (t.value("signal", 0) != 0) {
          reason = "Signal:" + std::to_string(t.value("signal", 0));
        } else {
          reason = "ExitCode:" + std::to_string(t.value("exitCode", 0));
        }
      } else if (cs.value("ready", false) && state.contains("running")) {
        has_running = true;
        ++ready;
      }
    }
    if (reason == "Completed" && has_running) reason = "Running";
    if (meta.contains("deletionTimestamp")) reason = "Terminating";
    cells.push_back(std::to_string(ready) + "/" + std::to_string(total));
    cells.push_back(reason);
    cells.push_back(std::to_string(restarts));
    cells.push_back(CreationAge(obj));
    cells.push_back(status.value("podIP", "<none>"));
    cells.push_back(obj.value("spec", json::object()).value("nodeName", "<none>"));
  } else if (info.group.empty() && info.plural == "namespaces") {
    cells.push_back(status.value("phase", "Active"));
    cells.push_back(CreationAge(obj));
  } else if (info.group.empty() && info.plural == "nodes") {
    std::string ready = "Unknown";
    for (const auto& c : status.value("conditions", json::array())) {
      if (c.value("type", "") == "Ready")
        ready = c.value("status", "") == "True" ? "Ready" : "NotReady";
    }
    cells.push_back(ready);
    cells.push_back(CreationAge(obj));
  } else {
    cells.push_back(CreationAge(obj));
  }
  return cells;
}

json CustomCell(const json& column, const json& obj) {
  std::vector<json> values = EvalJsonPath(obj, column.value("jsonPath", ""));
  if (values.empty() || values[0].is_null()) return nullptr;
  const json& v = values[0];
  std::string type = column.value("type", "string");
  if (type == "date") {
    return v.is_string() ? json(AgeOf(v.get<std::string>())) : json(nullptr);
  }
  if (v.is_object() || v.is_array()) return v.dump();
  if (type == "integer" && v.is_number()) return v.get<int64_t>();
  if (type == "string" && !v.is_string()) return v.dump();
  return v;
}

json RowObject(const json& obj, IncludeObject include) {
  switch (include) {
    case IncludeObject::kNone:
      return nullptr;
    case IncludeObject::kObject:
      return obj;
    case IncludeObject::kMetadata:
      return {{"kind", "PartialObjectMetadata"},
              {"apiVersion", "meta.k8s.io/v1"},
              {"metadata", obj.value("metadata", json::object())}};
  }
  return nullptr;
}

// Splits a JSONPath into steps: names, indexes ("[0]") and wildcards ("[*]").
std::vector<std::string> PathSteps(std::string path) {
  if (!path.empty() && path.front() == '{' && path.back() == '}') {
    path = path.substr(1, path.size() - 2);
  }
  std::vector<std::string> steps;
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '.') {
      ++i;
      size_t start = i;
      while (i < path.size() && path[i] != '.' && path[i] != '[') ++i;
      if (i > start) steps.push_back(path.substr(start, i - start));
    } else if (path[i] == '[') {
      size_t end = path.find(']', i);
      if (end == std::string::npos) break;
      std::string inner = path.substr(i + 1, end - i - 1);
      if (inner.size() >= 2 && (inner[0] == '\'' || inner[0] == '"')) {
        steps.push_back(inner.substr(1, inner.size() - 2));
      } else {
        steps.push_back("[" + inner + "]");
      }
      i = end + 1;
    } else {
      size_t start = i;
      while (i < path.size() && path[i] != '.' && path[i] != '[') ++i;
      steps.push_back(path.substr(start, i - start));
    }
  }
  return steps;
}

}  // namespace

std::vector<json> EvalJsonPath(const json& object, const std::string& path) {
  std::vector<json> current = {object};
  for (const auto& step : PathSteps(path)) {
    std::vector<json> next;
    for (const auto& v : current) {
      if (step == "[*]") {
        if (v.is_array()) {
          for (const auto& e : v) next.push_back(e);
        } else if (v.is_object()) {
          for (const auto& [k, e] : v.items()) next.push_back(e);
        }
      } else if (step.size() > 2 && step.front() == '[') {
        long idx = std::strtol(step.c_str() + 1, nullptr, 10);
        if (v.is_array()) {
          if (idx < 0) idx += static_cast<long>(v.size());
          if (idx >= 0 && static_cast<size_t>(idx) < v.size()) next.push_back(v[idx]);
        }
      } else if (v.is_object() && v.contains(step)) {
        next.push_back(v[step]);
      }
    }
    current = std::move(next);
  }
  return current;
}

json BuildTable(const ResourceInfo& info, const std::vector<json>& objects, IncludeObject include,
                bool with_columns, const std::string& resource_version,
                const std::string& continue_token) {
  json columns = json::array();
  bool custom_columns = info.custom && info.printer_columns.is_array();
  if (custom_columns) {
    columns.push_back(Column("Name", "string", "name", kNameDescription));
    for (const auto& c : info.printer_columns) {
      columns.push_back(Column(c.value("name", ""), c.value("type", "string"),
                               c.value("format", ""), c.value("description", ""),
                               c.value("priority", 0)));
    }
  } else {
    BuiltinColumns(info, &columns);
  }
  json rows = json::array();
  for (const auto& obj : objects) {
    json cells;
    if (custom_columns) {
      cells = json::array({obj.value("metadata", json::object()).value("name", "")});
      for (const auto& c : info.printer_columns) cells.push_back(CustomCell(c, obj));
    } else {
      cells = BuiltinCells(info, obj);
    }
    json row = {{"cells", cells}};
    json o = RowObject(obj, include);
    if (!o.is_null()) row["object"] = o;
    rows.push_back(row);
  }
  json meta = {{"resourceVersion", resource_version}};
  if (!continue_token.empty()) meta["continue"] = continue_token;
  return {{"kind", "Table"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", meta},
          {"columnDefinitions", with_columns ? columns : json::array()},
          {"rows", rows}};
}

std::string HumanDuration(std::chrono::seconds d) {
  long long seconds = d.count();
  if (seconds < -1) return "<invalid>";
  if (seconds < 0) return "0s";
  if (seconds < 120) return std::to_string(seconds) + "s";
  long long minutes = seconds / 60;
  if (minutes < 10) {
    long long s = seconds % 60;
    return s == 0 ? std::to_string(minutes) + "m"
                  : std::to_string(minutes) + "m" + std::to_string(s) + "s";
  }
  if (minutes < 180) return std::to_string(minutes) + "m";
  long long hours = seconds / 3600;
  if (hours < 8) {
    long long m = minutes % 60;
    return m == 0 ? std::to_string(hours) + "h"
                  : std::to_string(hours) + "h" + std::to_string(m) + "m";
  }
  if (hours < 48) return std::to_string(hours) + "h";
  if (hours < 24 * 8) {
    long long h = hours % 24;
    return h == 0 ? std::to_string(hours / 24) + "d"
                  : std::to_string(hours / 24) + "d" + std::to_string(h) + "h";
  }
  if (hours < 24 * 365 * 2) return std::to_string(hours / 24) + "d";
  if (hours < 24 * 365 * 8) {
    long long dy = (hours / 24) % 365;
    return dy == 0 ? std::to_string(hours / 24 / 365) + "y"
                   : std::to_string(hours / 24 / 365) + "y" + std::to_string(dy) + "d";
  }
  return std::to_string(hours / 24 / 365) + "y";
}

std::string AgeOf(const std::string& timestamp) {
  std::chrono::system_clock::time_point t;
  if (!ParseTimestamp(timestamp, &t)) return "<unknown>";
  return HumanDuration(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now() - t));
}

std::string FormatTimestamp(std::chrono::system_clock::time_point t) {
  std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool ParseTimestamp(const std::string& s, std::chrono::system_clock::time_point* out) {
  std::tm tm{};
  const char* end = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr) return false;
  // Fractions of a second are dropped; a numeric offset is honoured.
  while (*end == '.' || (*end >= '0' && *end <= '9')) ++end;
  long offset = 0;
  if (*end == '+' || *end == '-') {
    int hh = 0, mm = 0;
    if (sscanf(end + 1, "%d:%d", &hh, &mm) != 2) return false;
    offset = (hh * 3600L + mm * 60L) * (*end == '+' ? 1 : -1);
  } else if (*end != 'Z' && *end != '\0') {
    return false;
  }
  *out = std::chrono::system_clock::from_time_t(timegm(&tm) - offset);
  return true;
}

}  // namespace spawnpoint::kubetest
