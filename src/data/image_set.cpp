#include "data/image_set.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "base/error.h"
#include "base/fs.h"
#include "base/text.h"
#include "data/image_file.h"
#include "data/tar_file.h"

namespace perftrain::data {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool hidden(const std::string& name) { return !name.empty() && name[0] == '.'; }

// torchvision's IMG_EXTENSIONS; the first six are decoded here.
const char* const kReadable[] = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm"};
const char* const kUnreadable[] = {".tif", ".tiff", ".webp"};

bool readable_image(const std::string& name) {
  const std::string l = lower(name);
  return std::any_of(std::begin(kReadable), std::end(kReadable), [&](const char* e) { return ends_with(l, e); });
}

bool unreadable_image(const std::string& name) {
  const std::string l = lower(name);
  return std::any_of(std::begin(kUnreadable), std::end(kUnreadable), [&](const char* e) { return ends_with(l, e); });
}

// Every folder under dir (itself included, hidden ones left out), following
// symbolic links; `depth` guards against a link that loops.
void folders_under(const std::string& dir, int depth, std::vector<std::string>& out) {
  if (depth > 64)
    throw UsageError("image folder: more than 64 nested folders at " + base::printable(dir) +
                     " (a symbolic link that loops?)");
  out.push_back(dir);
  for (const std::string& name : fs::list_directory(dir)) {
    const std::string full = fs::join(dir, name);
    if (!hidden(name) && fs::is_directory(full)) folders_under(full, depth + 1, out);
  }
}

// A class's image files, in torchvision's order: sorted(os.walk(root)), then
// each folder's sorted file names.
std::vector<std::string> class_images(const std::string& class_dir) {
  std::vector<std::string> folders;
  folders_under(class_dir, 0, folders);
  std::sort(folders.begin(), folders.end());
  std::vector<std::string> files;
  for (const std::string& folder : folders) {
    for (const std::string& name : fs::list_directory(folder)) {
      const std::string full = fs::join(folder, name);
      if (hidden(name) || !fs::is_regular_file(full)) continue;
      if (unreadable_image(name))
        throw UsageError("image folder: " + base::printable(full) +
                         " is a TIFF or WebP image, which perftrain does not decode (convert it to PNG or JPEG)");
      if (readable_image(name)) files.push_back(full);
    }
  }
  return files;
}

// WebDataset's split of a member name: key = the path up to the first '.'
// of the file name, ext = the rest (lower-cased). False for names without
// both, and for hidden files.
bool split_member(const std::string& name, std::string& key, std::string& ext) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  if (base >= name.size() || name[base] == '.') return false;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos || dot + 1 == name.size()) return false;
  key = name.substr(0, dot);
  ext = lower(name.substr(dot + 1));
  return true;
}

bool parse_label(const std::vector<uint8_t>& bytes, int64_t& out) {
  std::string s(bytes.begin(), bytes.end());
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  if (a == std::string::npos) return false;
  s = s.substr(a, b - a + 1);
  if (s.size() > 18 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) return false;
  out = std::stoll(s);
  return true;
}

}  // namespace

ImageSet ImageSet::open(const std::string& path) {
  if (path.empty()) throw UsageError("images: data.path is empty (an image folder or a tar shard pattern)");
  return fs::is_directory(path) ? open_folder(path) : open_shards(path);
}

ImageSet ImageSet::open_folder(const std::string& path) {
  ImageSet set;
  set.path_ = path;
  for (const std::string& name : fs::list_directory(path))
    if (!hidden(name) && fs::is_directory(fs::join(path, name))) set.class_names_.push_back(name);
  if (set.class_names_.empty())
    throw UsageError("image folder " + base::printable(path) +
                     " has no class sub-folders (expected <folder>/<class>/<image>, as torchvision's ImageFolder)");
  for (size_t c = 0; c < set.class_names_.size(); ++c) {
    const std::string dir = fs::join(path, set.class_names_[c]);
    const std::vector<std::string> files = class_images(dir);
    if (files.empty())
      throw UsageError("image folder: class folder " + base::printable(dir) +
                       " holds no images (.jpg, .jpeg, .png, .ppm, .bmp, .pgm)");
    for (const std::string& f : files) set.items_.push_back({f, static_cast<int64_t>(c)});
  }
  return set;
}

ImageSet ImageSet::open_shards(const std::string& pattern) {
  ImageSet set;
  set.path_ = pattern;
  set.shards_ = expand_braces(pattern);
  if (set.shards_.empty()) throw UsageError("images: data.path '" + base::printable(pattern) + "' names no files");
  for (const std::string& shard : set.shards_)
    if (!fs::is_regular_file(shard))
      throw UsageError("images: " + base::printable(shard) +
                       (shard == pattern ? "" : " (from '" + base::printable(pattern) + "')") +
                       " is neither an image folder nor a tar shard file");
  int64_t max_label = -1;
  for (size_t s = 0; s < set.shards_.size(); ++s) {
    const std::string& shard = set.shards_[s];
    struct Sample {
      const TarMember* image = nullptr;
      int64_t label = -1;
    };
    const std::vector<TarMember> members = list_tar(shard);
    std::vector<std::string> order;
    std::map<std::string, Sample> samples;
    for (const TarMember& m : members) {
      std::string key, ext;
      if (!split_member(m.name, key, ext)) continue;
      const bool image = ext == "jpg" || ext == "jpeg" || ext == "png";
      if (!image && ext != "cls") continue;
      auto [it, fresh] = samples.try_emplace(key);
      if (fresh) order.push_back(key);
      const std::string where = "tar shard " + base::printable(shard) + ": sample '" + base::printable(key) + "'";
      if (image) {
        if (it->second.image) throw UsageError(where + " has two images (" + base::printable(it->second.image->name) +
                                               ", " + base::printable(m.name) + ")");
        it->second.image = &m;
      } else if (!parse_label(read_tar_member(shard, m), it->second.label)) {
        throw UsageError(where + ": " + base::printable(m.name) + " is not a class label (a decimal integer >= 0)");
      }
    }
    for (const std::string& key : order) {
      const Sample& smp = samples[key];
      const std::string where = "tar shard " + base::printable(shard) + ": sample '" + base::printable(key) + "'";
      if (!smp.image) throw UsageError(where + " has a .cls but no image (.jpg, .jpeg or .png)");
      if (smp.label < 0) throw UsageError(where + " has no .cls (its class label)");
      set.items_.push_back({shard + ":" + smp.image->name, smp.label});
      set.locations_.push_back({static_cast<int32_t>(s), smp.image->offset, smp.image->size, smp.image->name});
      max_label = std::max(max_label, smp.label);
    }
  }
  if (set.items_.empty())
    throw UsageError("images: the tar shards " + base::printable(pattern) + " hold no samples (<key>.jpg|png with <key>.cls)");
  for (int64_t c = 0; c <= max_label; ++c) set.class_names_.push_back(std::to_string(c));
  return set;
}

std::vector<uint8_t> ImageSet::read_bytes(int64_t i) const {
  const ImageItem& it = item(i);
  if (is_folder()) return read_image_bytes(it.source);
  const Location& loc = locations_.at(static_cast<size_t>(i));
  return read_tar_member(shards_[loc.shard], TarMember{loc.member, loc.offset, loc.size});
}

at::Tensor ImageSet::read_rgb(int64_t i) const {
  if (is_folder()) return read_image_file(item(i).source);
  const std::vector<uint8_t> bytes = read_bytes(i);
  return decode_image(bytes.data(), bytes.size(), item(i).source);
}

std::string ImageSet::describe() const {
  const std::string where = is_folder() ? "image folder " + path_
                                        : std::to_string(shards_.size()) + " tar shard" +
                                              (shards_.size() == 1 ? " " : "s ") + path_;
  return base::printable(where);
}

}  // namespace perftrain::data
