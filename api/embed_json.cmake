# Writes OUT, a C++ file defining spawnpoint::api::<NAME> as the text of IN (a JSON file), for
# api/CMakeLists.txt: cmake -DIN=... -DOUT=... -DNAME=... -P embed_json.cmake
file(READ "${IN}" text)
string(FIND "${text}" ")spawnpoint_json\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw string's delimiter")
endif()
file(WRITE "${OUT}.tmp"
  "// Generated from ${IN} by api/embed_json.cmake; do not edit.\n"
  "namespace spawnpoint::api {\n"
  "extern const char ${NAME}[];\n"
  "const char ${NAME}[] = R\"spawnpoint_json(${text})spawnpoint_json\";\n"
  "}  // namespace spawnpoint::api\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
